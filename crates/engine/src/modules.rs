//! Where in the model a call runs: the module path of forward calls, and the
//! forward call behind each backward call.
//!
//! - **Module paths.** The plugin's Python hooks (cpp/hook/python_hooks.cpp) call
//!   `module_enter(path)` (a builtin function of the plugin's, which
//!   interns each path once: [`enter_id`]) before each `nn.Module.forward`
//!   and `module_exit()` after it. Each thread keeps the stack of modules it
//!   is inside; a call takes the innermost one. Paths are interned: a call
//!   carries a `u32`.
//! - **Backward to forward.** A forward call that makes autograd nodes tells
//!   the engine the nodes' sequence numbers (they are per thread, so the key
//!   is the forward thread and the number). The innermost recorded call that
//!   made a node claims it: it exits first. A backward call then finds the
//!   forward call of the node being run, with that call's module; the
//!   engine's work for a node (a bias gradient's `sum_to`, accumulating its
//!   outputs) counts as the node's (cpp/hook/threads.cpp).
//! - **Accumulation into a parameter.** An AccumulateGrad node was made by
//!   no forward call: its calls (`detach`, `add_`) take the module whose
//!   parameter it accumulates into, and no `fwd_seq`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

use crate::names::{self, NameId};

/// An interned module path (crate::names).
pub type ModuleId = NameId;

/// The id of a path, the same for the same path in every thread.
pub fn intern(path: &str) -> ModuleId {
    names::intern(path).unwrap_or(ModuleId::MAX)
}

/// The path of an id.
pub fn path(id: ModuleId) -> Option<&'static str> {
    names::get(id)
}

thread_local! {
    static STACK: RefCell<Vec<ModuleId>> = const { RefCell::new(Vec::new()) };
}

/// Pushed for a module whose calls must carry no path: code compiled by
/// torch.compile runs its submodules without their hooks, so the innermost
/// module of its calls is unknown (cpp/hook/python_hooks.cpp enters "").
const UNKNOWN: ModuleId = ModuleId::MAX;

/// A module's forward begins on this thread; "" for one whose calls carry no
/// module.
pub fn enter(path: &str) {
    let id = if path.is_empty() {
        UNKNOWN
    } else {
        intern(path)
    };
    push(id, path);
}

/// [`enter`] by the path's id (`UNKNOWN` for ""): the hooks intern each
/// path once, so a module call takes no lock and hashes no text.
pub fn enter_id(id: ModuleId) {
    let path = if id == UNKNOWN {
        ""
    } else {
        names::get(id).unwrap_or("")
    };
    push(id, path);
}

fn push(id: ModuleId, path: &str) {
    let depth = STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.push(id);
        s.len()
    });
    if let Some(c) = crate::capture::get() {
        c.on_module_enter(path, depth);
    }
}

/// The innermost module's forward ends on this thread; an exit without an
/// entry (hooks installed in the middle of a forward) is ignored.
pub fn exit() {
    let depth = STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        s.len()
    });
    if let Some(c) = crate::capture::get() {
        c.on_module_exit(depth);
    }
}

/// The innermost module this thread is inside.
pub fn current() -> Option<ModuleId> {
    STACK.with(|s| s.borrow().last().copied().filter(|&id| id != UNKNOWN))
}

/// What a backward call learns of the forward call that made its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forward {
    pub seq: i64,
    pub module: Option<ModuleId>,
}

/// Autograd node (forward thread, sequence number) → the forward call that
/// made it. Bounded: the oldest entries go first, so a job that never runs
/// backward keeps a fixed amount.
pub struct NodeMap {
    map: HashMap<(i64, i64), Forward>,
    order: VecDeque<(i64, i64)>,
    cap: usize,
}

impl NodeMap {
    pub fn new(cap: usize) -> Self {
        NodeMap {
            map: HashMap::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    /// The nodes `first..end` made on `thread` by the call `fwd`, except
    /// those a call inside it claimed already.
    pub fn claim(&mut self, thread: i64, first: i64, end: i64, fwd: Forward) {
        for nr in first..end {
            let key = (thread, nr);
            if self.map.contains_key(&key) {
                continue;
            }
            if self.order.len() >= self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
            self.map.insert(key, fwd);
            self.order.push_back(key);
        }
    }

    pub fn get(&self, thread: i64, nr: i64) -> Option<Forward> {
        self.map.get(&(thread, nr)).copied()
    }
}

/// Enough for the autograd nodes of a few steps of a large model.
const NODE_MAP_CAP: usize = 1 << 18;

fn nodes() -> &'static Mutex<NodeMap> {
    static N: OnceLock<Mutex<NodeMap>> = OnceLock::new();
    N.get_or_init(|| Mutex::new(NodeMap::new(NODE_MAP_CAP)))
}

pub fn claim_nodes(thread: i64, first: i64, end: i64, fwd: Forward) {
    // A call that made more nodes than the map holds would only evict its
    // own: keep the last ones.
    let first = first.max(end - NODE_MAP_CAP as i64);
    if let Ok(mut n) = nodes().lock() {
        n.claim(thread, first, end, fwd);
    }
}

pub fn forward_of(thread: i64, nr: i64) -> Option<Forward> {
    nodes().lock().ok()?.get(thread, nr)
}

/// The node `thread` of an AccumulateGrad node (cpp/hook/threads.cpp,
/// kAccumulateGradThread): its number is then the id of the module whose
/// parameter it accumulates into. Forward threads are never negative.
pub const ACCUMULATE_GRAD_THREAD: i64 = -2;

/// What a backward call in the node (`thread`, `nr`) belongs to: the
/// `seq` of the forward call that made the node and that call's module;
/// for accumulation into a parameter, no forward call and the parameter's
/// module.
pub fn link_of(thread: i64, nr: i64) -> (Option<i64>, Option<ModuleId>) {
    if thread == ACCUMULATE_GRAD_THREAD {
        return (None, ModuleId::try_from(nr).ok());
    }
    match forward_of(thread, nr) {
        Some(f) => (Some(f.seq), f.module),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_innermost_call_claims_its_nodes_first() {
        let mut m = NodeMap::new(16);
        let addmm = Forward {
            seq: 5,
            module: Some(1),
        };
        let linear = Forward {
            seq: 4,
            module: Some(1),
        };
        m.claim(1, 10, 11, addmm); // addmm exits first
        m.claim(1, 9, 12, linear); // linear's range covers it
        assert_eq!(m.get(1, 10), Some(addmm));
        assert_eq!(m.get(1, 9), Some(linear));
        assert_eq!(m.get(1, 11), Some(linear));
        assert_eq!(m.get(2, 10), None, "sequence numbers are per thread");
    }

    #[test]
    fn accumulation_links_to_the_parameters_module_and_no_forward_call() {
        let fc1 = intern("h.0.c_fc");
        assert_eq!(
            link_of(ACCUMULATE_GRAD_THREAD, i64::from(fc1)),
            (None, Some(fc1))
        );
        let f = Forward {
            seq: 7,
            module: Some(fc1),
        };
        claim_nodes(1 << 40, 3, 4, f);
        assert_eq!(link_of(1 << 40, 3), (Some(7), Some(fc1)));
        assert_eq!(link_of(1 << 40, 4), (None, None));
    }

    #[test]
    fn the_map_is_bounded_and_forgets_the_oldest() {
        let mut m = NodeMap::new(3);
        let f = |seq| Forward { seq, module: None };
        for nr in 0..5 {
            m.claim(0, nr, nr + 1, f(nr));
        }
        assert_eq!(m.get(0, 0), None);
        assert_eq!(m.get(0, 1), None);
        assert_eq!(m.get(0, 4), Some(f(4)));
        assert_eq!(m.map.len(), 3);
    }

    #[test]
    fn module_stacks_are_per_thread_and_paths_interned() {
        enter("Model");
        enter("blocks.0");
        let id = current().unwrap();
        assert_eq!(path(id), Some("blocks.0"));
        assert_eq!(intern("blocks.0"), id);
        std::thread::spawn(|| assert_eq!(current(), None))
            .join()
            .unwrap();
        exit();
        assert_eq!(path(current().unwrap()), Some("Model"));
        exit();
        exit(); // unbalanced: ignored
        assert_eq!(current(), None);
    }
}
