//! List calls (`_foreach_lerp_(self[], tensors1[])`): which of a call's
//! tensors make up element `i`, and how that element's tensors pair, by
//! position, with those of a per-element call (`lerp_(self, end)`) whose
//! argument names differ.

use opdump_format::Role;

use crate::dump::Dump;
use crate::tensor_row::TensorRow;

/// `aten::_foreach_lerp_` and its out-of-place form: a call that applies
/// one op to every element of its list arguments.
pub fn is_list_op(op: &str) -> bool {
    bare(op).starts_with("_foreach_")
}

/// The per-element op a list op applies, without namespace or trailing `_`
/// (`aten::_foreach_add_` -> `add`); `None` for other ops.
pub fn list_base(op: &str) -> Option<&str> {
    let name = bare(op).strip_prefix("_foreach_")?;
    let base = name.strip_suffix('_').unwrap_or(name);
    (!base.is_empty()).then_some(base)
}

/// An op without namespace or trailing `_` (`aten::add_` -> `add`), as
/// [`list_base`] names the op a list op applies; `__iand__` stays whole.
pub fn loop_base(op: &str) -> &str {
    let name = bare(op);
    match name.strip_suffix('_') {
        Some(b) if !b.is_empty() && !b.ends_with('_') => b,
        _ => name,
    }
}

fn bare(op: &str) -> &str {
    crate::opclass::after_last_colons(op)
}

/// The tensors of a list call by element: those of element `i` of its list
/// arguments, and those every element shares (a `Tensor` argument beside
/// the lists: `_foreach_add_.Tensor`'s `other`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layout {
    /// Per element (the rows' `list_index`), its tensors in row order.
    pub elements: Vec<Vec<u32>>,
    /// Tensors that are not a list's element, in row order.
    pub shared: Vec<u32>,
}

impl Layout {
    /// The layout of call `i` of `d`, reading its rows once.
    pub fn of(d: &Dump, i: u32) -> Self {
        let range = d.tensors_of(i);
        let mut rows = Vec::new();
        d.tensors.rows_of(range.clone(), &mut rows);
        let mut l = Layout::default();
        for (t, r) in range.zip(&rows) {
            if r.role == Role::None {
                continue;
            }
            if r.list_index >= 0 {
                let k = r.list_index as usize;
                if l.elements.len() <= k {
                    l.elements.resize_with(k + 1, Vec::new);
                }
                l.elements[k].push(t);
            } else {
                l.shared.push(t);
            }
        }
        l
    }

    /// How many elements the lists have.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// Whether the call has no list element.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// The tensors of element `k` and the shared ones, in row order
    /// (ascending); empty when there is no such element.
    pub fn element(&self, k: usize) -> Vec<u32> {
        let Some(own) = self.elements.get(k) else {
            return Vec::new();
        };
        let mut out: Vec<u32> = own.iter().chain(&self.shared).copied().collect();
        out.sort_unstable();
        out
    }
}

/// Pairs two lists of tensors (with their rows) by position among the
/// inputs and among the outputs: the list call's `self[i]`, `tensors1[i]`
/// with the per-element call's `self`, `end`. Tensors beyond the shorter
/// side's count of a role (the `other` scalar a loop's `mul_` takes where
/// `_foreach_mul_.Scalar` takes a number) are left out, not unpaired: the
/// two calls spell the same arguments differently.
pub fn pair_by_position(
    xa: &[(u32, TensorRow)],
    xb: &[(u32, TensorRow)],
    out: &mut Vec<(Option<u32>, Option<u32>)>,
) {
    for role in [Role::Input, Role::Output] {
        let ia = xa.iter().filter(|x| x.1.role == role);
        let ib = xb.iter().filter(|x| x.1.role == role);
        out.extend(ia.zip(ib).map(|(x, y)| (Some(x.0), Some(y.0))));
    }
}

/// The rows of tensors `ts` of `d`, each with its index.
pub fn rows_of(d: &Dump, ts: &[u32]) -> Vec<(u32, TensorRow)> {
    ts.iter().map(|&t| (t, d.tensors.row(t))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_list_op("aten::_foreach_lerp_"));
        assert!(!is_list_op("aten::lerp_"));
        assert_eq!(list_base("aten::_foreach_add_"), Some("add"));
        assert_eq!(list_base("aten::_foreach_sqrt"), Some("sqrt"));
        assert_eq!(list_base("aten::add_"), None);
        assert_eq!(loop_base("aten::add_"), "add");
        assert_eq!(loop_base("aten::div"), "div");
        assert_eq!(loop_base("aten::__iand__"), "__iand__");
    }
}
