//! Interned names: the ops, overloads, arguments, dtypes, devices and module
//! paths that repeat in every record.
//!
//! Each distinct name is stored once, for the life of the process, and
//! records borrow it (`Name::Borrowed`): a record carries no allocation for
//! its names, and the writer thread frees none. The C++ hook asks for a
//! name's id once per distinct name and caches it (cpp/rows/interned.cpp); an id
//! resolves without a lock, from any thread. Names are a bounded set (those of
//! the registered ops' schemas, of dtypes and devices, of the model's
//! modules), so keeping them costs a few hundred KiB at most.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

/// An interned name.
pub type NameId = u32;

/// Every name interned so far, by id: append-only, read without a lock.
static NAMES: boxcar::Vec<&'static str> = boxcar::Vec::new();

/// Ids by name, for interning (rare: once per distinct name and thread
/// cache).
fn ids() -> &'static Mutex<HashMap<&'static str, NameId>> {
    static IDS: OnceLock<Mutex<HashMap<&'static str, NameId>>> = OnceLock::new();
    IDS.get_or_init(Default::default)
}

/// The id of `name`, the same in every thread. None only when more than
/// 2³² names were interned.
pub fn intern(name: &str) -> Option<NameId> {
    let mut ids = ids().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&id) = ids.get(name) {
        return Some(id);
    }
    // Pushed under the lock, so ids are dense and each name has one.
    let id = NameId::try_from(NAMES.count()).ok()?;
    let stored: &'static str = Box::leak(name.into());
    let index = NAMES.push(stored);
    debug_assert_eq!(index, id as usize);
    ids.insert(stored, id);
    Some(id)
}

/// The name of an id that [`intern`] returned.
pub fn get(id: NameId) -> Option<&'static str> {
    NAMES.get(id as usize).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_id_per_name_across_threads() {
        let names = ["aten::mm", "float32", "cpu", "self", "aten::mm", "0"];
        let ids: Vec<Vec<NameId>> = (0..4)
            .map(|_| std::thread::spawn(move || names.iter().map(|n| intern(n).unwrap()).collect()))
            .map(|h| h.join().unwrap())
            .collect();
        assert!(ids.windows(2).all(|w| w[0] == w[1]));
        let first = &ids[0];
        assert_eq!(first[0], first[4]);
        for (n, id) in names.iter().zip(first) {
            assert_eq!(get(*id), Some(*n));
        }
        assert_ne!(first[0], first[1]);
    }

    #[test]
    fn an_id_never_interned_resolves_to_nothing() {
        assert_eq!(get(NameId::MAX), None);
    }
}
