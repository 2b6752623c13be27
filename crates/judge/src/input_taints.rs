//! The taint each input of A had when it was judged, kept for reports to
//! recompute the same verdicts.
//!
//! One value per tensor of A, but almost all of them are 0: an input is
//! tainted only downstream of a divergence, or where it differs on its
//! own. Dense, the values and their flags took 5 bytes per tensor (140 MB
//! for the 10M op calls of the synthetic pair); here a page of
//! [`PAGE`] tensors is allocated when the first nonzero value of its range
//! is written, so clean stretches of the run cost a pointer per page and
//! a tainted one costs what the dense columns did.

use crate::metrics::Taint;

/// Tensors per page.
pub const PAGE: usize = 4096;

/// Per tensor of A: the taint its input had, rounded to f32 as reported,
/// and whether that taint was the input's own error ([`Taint::own`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputTaints {
    len: usize,
    pages: Vec<Option<Box<Page>>>,
}

#[derive(Clone, Debug, PartialEq)]
struct Page {
    size: [f32; PAGE],
    /// Bit `i % 64` of word `i / 64`: the taint of tensor `i` is its own.
    own: [u64; PAGE / 64],
}

impl InputTaints {
    /// `len` tensors, none tainted.
    pub fn new(len: usize) -> Self {
        InputTaints {
            len,
            pages: vec![None; len.div_ceil(PAGE)],
        }
    }

    /// How many tensors there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets tensor `t`'s taint (a later value replaces an earlier one).
    /// Panics when `t` is out of range, like indexing.
    pub fn set(&mut self, t: u32, size: f32, own: bool) {
        let t = t as usize;
        assert!(t < self.len, "tensor {t} of {}", self.len);
        let slot = &mut self.pages[t / PAGE];
        let page = match slot {
            Some(p) => p,
            // An untainted value in an untouched page is already there.
            None if size.to_bits() == 0 && !own => return,
            None => slot.insert(Box::new(Page {
                size: [0.0; PAGE],
                own: [0; PAGE / 64],
            })),
        };
        let i = t % PAGE;
        page.size[i] = size;
        let bit = 1u64 << (i % 64);
        if own {
            page.own[i / 64] |= bit;
        } else {
            page.own[i / 64] &= !bit;
        }
    }

    /// Tensor `t`'s taint, as [`InputTaints::set`] left it (0 and not own
    /// when never set). Panics when `t` is out of range.
    pub fn get(&self, t: u32) -> (f32, bool) {
        let t = t as usize;
        assert!(t < self.len, "tensor {t} of {}", self.len);
        match &self.pages[t / PAGE] {
            Some(p) => {
                let i = t % PAGE;
                (p.size[i], p.own[i / 64] >> (i % 64) & 1 == 1)
            }
            None => (0.0, false),
        }
    }

    /// Tensor `t`'s taint as the judge reads it back.
    pub fn taint(&self, t: u32) -> Taint {
        let (size, own) = self.get(t);
        Taint {
            size: size as f64,
            own,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_was_set_and_allocates_only_tainted_pages() {
        let n = PAGE * 3 + 5;
        let mut x = InputTaints::new(n);
        // Zeros alone allocate nothing.
        for t in 0..n as u32 {
            x.set(t, 0.0, false);
        }
        assert!(x.pages.iter().all(Option::is_none));
        x.set(PAGE as u32 + 63, 0.5, true);
        x.set(PAGE as u32 + 64, 2.0, false);
        x.set((3 * PAGE + 4) as u32, f32::INFINITY, false);
        // Negative zero is a value (bits) to keep, not "untainted".
        x.set(1, -0.0, false);
        assert_eq!(x.pages.iter().filter(|p| p.is_some()).count(), 3);
        assert_eq!(x.get(PAGE as u32 + 63), (0.5, true));
        assert_eq!(x.get(PAGE as u32 + 64), (2.0, false));
        assert_eq!(x.get(PAGE as u32 + 62), (0.0, false));
        assert_eq!(x.get((3 * PAGE + 4) as u32), (f32::INFINITY, false));
        assert!(x.get(1).0.is_sign_negative());
        // A later value replaces an earlier one, flag included.
        x.set(PAGE as u32 + 63, 0.0, false);
        assert_eq!(x.get(PAGE as u32 + 63), (0.0, false));
        assert_eq!(x.get(0), (0.0, false));
    }

    #[test]
    #[should_panic]
    fn out_of_range_panics_like_indexing() {
        InputTaints::new(3).get(3);
    }
}
