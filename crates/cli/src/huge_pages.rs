//! The system allocator, asking for transparent huge pages under large
//! blocks.
//!
//! `compare` keeps tables of hundreds of MB (the provenance map, the sets
//! of what unaligned calls read, the aligned pairs) and reads or inserts
//! at random into them, once per tensor. With 4 KiB pages nearly every
//! such access misses the TLB as well as the caches, and in a virtual
//! machine a TLB miss walks two page tables. Where the kernel gives huge
//! pages only on request (`transparent_hugepage/enabled` = `madvise`, the
//! common default), a block of [`HUGE_FROM`] bytes or more is marked for
//! them as it is allocated: 2 MiB pages cover a 200 MB table with 100 TLB
//! entries. Smaller blocks (most of the program's) stay as they are, so
//! resident memory grows by at most the rounding of the large blocks.
//! Where the kernel gives huge pages always, or never, the mark changes
//! nothing.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks from this size on are marked. The chunk caches and Parquet's
/// batches stay below it; the per-pair and per-call columns and the hash
/// tables of the 10M pair are above it.
pub const HUGE_FROM: usize = 16 << 20;

/// [`System`], marking large blocks for transparent huge pages.
pub struct HugePages;

/// The page-aligned part of `len` bytes at `p`, where a mark applies.
fn inner_pages(p: usize, len: usize) -> Option<(usize, usize)> {
    const PAGE: usize = 4096;
    let start = p.checked_add(PAGE - 1)? & !(PAGE - 1);
    let end = p.checked_add(len)? & !(PAGE - 1);
    (end > start).then(|| (start, end - start))
}

fn mark(p: *mut u8, len: usize) {
    if p.is_null() || len < HUGE_FROM {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Some((start, n)) = inner_pages(p as usize, len) {
        // SAFETY: the range lies inside a block the allocator just handed
        // out; MADV_HUGEPAGE changes how its pages are backed, never their
        // contents, and a failure (an old kernel) leaves them as they were.
        unsafe {
            libc::madvise(start as *mut libc::c_void, n, libc::MADV_HUGEPAGE);
        }
    }
}

// SAFETY: every call is forwarded to `System` with its own arguments; the
// mark only advises the kernel on pages of the block returned.
unsafe impl GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        mark(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        mark(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let q = unsafe { System.realloc(p, layout, new_size) };
        mark(q, new_size);
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_whole_pages_inside_the_block() {
        assert_eq!(inner_pages(4096, 8192), Some((4096, 8192)));
        assert_eq!(inner_pages(4097, 8192), Some((8192, 4096)));
        assert_eq!(inner_pages(100, 4000), None);
        assert_eq!(inner_pages(usize::MAX - 10, 100), None);
    }

    #[test]
    fn large_blocks_are_usable_and_keep_their_contents_when_grown() {
        let a = HugePages;
        let layout = Layout::from_size_align(HUGE_FROM + 12345, 8).unwrap();
        // SAFETY: a nonzero layout; the block is written within its size
        // and freed with the layout it has.
        unsafe {
            let p = a.alloc_zeroed(layout);
            assert!(!p.is_null());
            assert!(std::slice::from_raw_parts(p, layout.size())
                .iter()
                .all(|&b| b == 0));
            for k in (0..layout.size()).step_by(4093) {
                *p.add(k) = (k % 251) as u8;
            }
            let n = 2 * HUGE_FROM;
            let q = a.realloc(p, layout, n);
            assert!(!q.is_null());
            for k in (0..layout.size()).step_by(4093) {
                assert_eq!(*q.add(k), (k % 251) as u8);
            }
            a.dealloc(q, Layout::from_size_align(n, 8).unwrap());
        }
    }
}
