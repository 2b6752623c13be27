//! A column of fixed-size records too large to keep resident.
//!
//! Records are appended in order; every full chunk of [`CHUNK`] records is
//! written to an unlinked temporary file and dropped from memory, so a dump
//! of any size holds one partial chunk while it is read. A chunk is written
//! LZ4-compressed (a block of `lz4_flex`), unless its record type says
//! otherwise ([`Record::COMPRESS`]): repeated values and ids take a
//! fraction of their size, and the disk writes shrink with them (the kernel
//! throttles a process that dirties gigabytes of page cache: uncompressed,
//! the spill of 10 million op calls took twice as long to read). LZ4
//! replaced Snappy: about as small, and faster both ways (the tensor
//! spill's compression was a quarter of the time of the thread that reads
//! B's rows, and decompressing it a tenth of the measuring thread's).
//! Byte-shuffling each chunk before compressing it was tried: it cost more
//! time than it saved.
//!
//! Records are read back through a small per-thread cache of decoded
//! chunks, one cache per record type ([`CACHED_CHUNKS`] chunks over all
//! stores of that type): walks in index order (the measuring pass) decode
//! each chunk once, a few random look-ups (the calls a report shows) a
//! chunk each, and a look-up that hits a cached chunk is an index and a
//! copy. Resident memory is bounded by the caches, not by the dump; the
//! rest lives in the page cache or on disk, where the kernel may drop it.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::LocalKey;

use crate::error::{Error, Result};

/// Records per chunk.
pub const CHUNK: usize = 8192;

/// Chunks one thread keeps of one record type, over all stores. The walks
/// in order (aligning, measuring, the one-sided pass) hold one or two
/// chunks of each dump; 32 chunks cost about 40 MB per thread alive (both
/// record types) for no time measured against 8 on the 10M pair.
pub const CACHED_CHUNKS: usize = 8;

/// A record with a fixed-size byte form.
pub trait Record: Copy + Default + 'static {
    /// Bytes of one record.
    const SIZE: usize;
    /// Whether chunks are written compressed; records read back in
    /// many passes and that compress less are cheaper written as they are.
    const COMPRESS: bool = true;
    /// Writes the record into `out` (`SIZE` bytes).
    fn put(&self, out: &mut [u8]);
    /// Reads one record from `b` (`SIZE` bytes).
    fn take(b: &[u8]) -> Self;
    /// This record type's per-thread cache (declare it with
    /// [`chunk_cache!`]).
    fn cache() -> &'static LocalKey<RefCell<ChunkCache<Self>>>;
}

/// Writes byte strings one after another into a record's bytes
/// ([`Record::put`]).
pub struct PutBytes<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl<'a> PutBytes<'a> {
    pub fn new(out: &'a mut [u8]) -> Self {
        PutBytes { out, at: 0 }
    }

    pub fn put(&mut self, b: &[u8]) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

/// The `N` bytes of a record's bytes `b` from offset `k` ([`Record::take`]).
/// Inlined with a constant `k`, the check that `k + N` fits is made at
/// compile time; past the end, zeros, which a record never reaches.
#[inline(always)]
pub fn fixed<const S: usize, const N: usize>(b: &[u8; S], k: usize) -> [u8; N] {
    match b.get(k..k + N) {
        Some(s) => {
            let mut out = [0u8; N];
            out.copy_from_slice(s);
            out
        }
        None => [0; N],
    }
}

/// Declares the per-thread chunk cache of a record type, for
/// [`Record::cache`].
macro_rules! chunk_cache {
    ($t:ty) => {
        fn cache(
        ) -> &'static ::std::thread::LocalKey<::std::cell::RefCell<$crate::spill::ChunkCache<$t>>> {
            ::std::thread_local! {
                static CACHE: ::std::cell::RefCell<$crate::spill::ChunkCache<$t>> =
                    const { ::std::cell::RefCell::new($crate::spill::ChunkCache::new()) };
            }
            &CACHE
        }
    };
}
pub(crate) use chunk_cache;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The column: full chunks in the spill file, the last, partial one here.
pub struct Spill<T: Record> {
    /// Distinguishes this store's chunks in the per-thread caches.
    id: u64,
    /// Chunk `k` is `at[k]..at[k + 1]` of the file: `at.len() - 1` full
    /// chunks are written out.
    at: Vec<u64>,
    file: Option<File>,
    tail: Vec<T>,
    /// The byte forms of a chunk being written, kept for the next one.
    rows: Vec<u8>,
    packed: Vec<u8>,
}

impl<T: Record> Default for Spill<T> {
    fn default() -> Self {
        Spill {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            at: vec![0],
            file: None,
            tail: Vec::new(),
            rows: Vec::new(),
            packed: Vec::new(),
        }
    }
}

impl<T: Record + Send + Sync> opdump_judge::Rows<T> for Spill<T> {
    fn len(&self) -> usize {
        Spill::len(self)
    }

    fn get(&self, i: usize) -> T {
        Spill::get(self, i)
    }

    fn get_range(&self, range: std::ops::Range<usize>, out: &mut Vec<T>) {
        Spill::get_range(self, range, out)
    }
}

impl<T: Record> Spill<T> {
    pub fn len(&self) -> usize {
        self.spilled_chunks() * CHUNK + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Full chunks written to the spill file so far.
    pub fn spilled_chunks(&self) -> usize {
        self.at.len() - 1
    }

    /// Records held in memory by the store itself (the partial chunk; the
    /// per-thread caches come on top).
    pub fn resident(&self) -> usize {
        self.tail.len()
    }

    #[inline]
    pub fn push(&mut self, r: T) -> Result<()> {
        if self.tail.capacity() == 0 {
            self.tail.reserve_exact(CHUNK);
        }
        self.tail.push(r);
        if self.tail.len() == CHUNK {
            self.write_tail()?;
        }
        Ok(())
    }

    fn write_tail(&mut self) -> Result<()> {
        self.rows.resize(CHUNK * T::SIZE, 0);
        for (r, out) in self.tail.iter().zip(self.rows.chunks_exact_mut(T::SIZE)) {
            r.put(out);
        }
        let bytes = if T::COMPRESS {
            self.packed
                .resize(lz4_flex::block::get_maximum_output_size(self.rows.len()), 0);
            let n = lz4_flex::block::compress_into(&self.rows, &mut self.packed)
                .map_err(|e| Error::new(format!("cannot compress a chunk of the dump: {e}")))?;
            &self.packed[..n]
        } else {
            &self.rows[..]
        };
        let n = bytes.len();
        let file = match &mut self.file {
            Some(f) => f,
            None => self.file.insert(tempfile::tempfile().map_err(|e| {
                Error::new(format!(
                    "cannot create a temporary file in {} to hold the dump's tensors: {e}; point TMPDIR at a writable directory with space",
                    std::env::temp_dir().display()
                ))
            })?),
        };
        file.write_all(bytes).map_err(|e| {
            Error::new(format!(
                "cannot write the temporary file that holds the dump's tensors: {e}; free space under TMPDIR or point it at a larger disk"
            ))
        })?;
        let end = self.at[self.spilled_chunks()] + n as u64;
        self.at.push(end);
        self.tail.clear();
        Ok(())
    }

    /// Record `i`. Panics when `i` is out of range, like indexing.
    #[inline]
    pub fn get(&self, i: usize) -> T {
        let c = i / CHUNK;
        let spilled = self.spilled_chunks();
        if c >= spilled {
            return self.tail[i - spilled * CHUNK];
        }
        T::cache().with(|cache| cache.borrow_mut().chunk(self, c)[i % CHUNK])
    }

    /// Appends records `range` to `out`: one cache look-up per chunk, not
    /// per record (the few rows of an op call, read together).
    pub fn get_range(&self, range: std::ops::Range<usize>, out: &mut Vec<T>) {
        let mut i = range.start;
        while i < range.end {
            let c = i / CHUNK;
            let end = range.end.min((c + 1) * CHUNK);
            let spilled = self.spilled_chunks();
            if c >= spilled {
                let base = spilled * CHUNK;
                out.extend_from_slice(&self.tail[i - base..end - base]);
            } else {
                T::cache().with(|cache| {
                    let mut cache = cache.borrow_mut();
                    let rows = cache.chunk(self, c);
                    out.extend_from_slice(&rows[i % CHUNK..i % CHUNK + (end - i)]);
                });
            }
            i = end;
        }
    }

    /// Decodes chunk `c` into `out` (its records, replacing what it held),
    /// through the scratch buffers.
    fn load(&self, c: usize, scratch: &mut Scratch, out: &mut Vec<T>) {
        let (s, e) = (self.at[c], self.at[c + 1]);
        scratch.rows.resize(CHUNK * T::SIZE, 0);
        let into = if T::COMPRESS {
            scratch.packed.resize((e - s) as usize, 0);
            &mut scratch.packed
        } else {
            &mut scratch.rows
        };
        // The file is ours and was written whole (a spilled chunk implies
        // it): only the system failing (an I/O error of the disk, memory
        // corrupted) gets past these.
        let read = match &self.file {
            Some(file) => file.read_exact_at(into, s),
            None => Err(std::io::Error::other("no file holds the spilled chunks")),
        };
        if let Err(e) = read {
            panic!("reading back the temporary file that holds the dump's tensors: {e}");
        }
        if T::COMPRESS {
            match lz4_flex::block::decompress_into(&scratch.packed, &mut scratch.rows) {
                Ok(n) if n == scratch.rows.len() => {}
                Ok(n) => panic!(
                    "decompressing the temporary file that holds the dump's tensors: {n} bytes, not {}",
                    scratch.rows.len()
                ),
                Err(e) => {
                    panic!("decompressing the temporary file that holds the dump's tensors: {e}")
                }
            }
        }
        out.clear();
        out.extend(scratch.rows.chunks_exact(T::SIZE).map(T::take));
    }
}

/// Buffers a thread reuses to read chunks back.
struct Scratch {
    packed: Vec<u8>,
    rows: Vec<u8>,
}

/// One thread's decoded chunks of one record type, least recently used
/// evicted first (its buffers reused for the chunk that replaces it).
pub struct ChunkCache<T> {
    slots: Vec<Slot<T>>,
    /// The slots of the last two chunks read, the latest first: a walk in
    /// order over two stores (the two dumps' tensors of each pair) hits
    /// them again and again.
    last: [usize; 2],
    tick: u64,
    /// A chunk's bytes on their way from the file; made at the first load.
    scratch: Option<Box<Scratch>>,
}

struct Slot<T> {
    store: u64,
    chunk: usize,
    used: u64,
    data: Vec<T>,
}

impl<T: Record> Default for ChunkCache<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Record> ChunkCache<T> {
    pub const fn new() -> Self {
        ChunkCache {
            slots: Vec::new(),
            last: [0; 2],
            tick: 0,
            scratch: None,
        }
    }

    /// The records of chunk `c` of `store`.
    #[inline]
    fn chunk(&mut self, store: &Spill<T>, c: usize) -> &[T] {
        let k = match self.recent(store.id, c) {
            Some(k) => k,
            None => self.find_or_load(store, c),
        };
        &self.slots[k].data
    }

    /// The slot of a chunk among the last two read.
    #[inline]
    fn recent(&self, store: u64, chunk: usize) -> Option<usize> {
        self.last.into_iter().find(|&k| {
            self.slots
                .get(k)
                .is_some_and(|s| s.store == store && s.chunk == chunk)
        })
    }

    /// The slot of a chunk, loaded when this thread holds it nowhere (in
    /// place of the least recently used when all slots are taken).
    #[inline(never)]
    fn find_or_load(&mut self, store: &Spill<T>, chunk: usize) -> usize {
        self.tick += 1;
        let hit = |s: &Slot<T>| s.store == store.id && s.chunk == chunk;
        let k = if let Some(k) = self.slots.iter().position(hit) {
            k
        } else {
            let k = if self.slots.len() < CACHED_CHUNKS {
                self.slots.push(Slot {
                    store: store.id,
                    chunk,
                    used: 0,
                    data: Vec::with_capacity(CHUNK),
                });
                self.slots.len() - 1
            } else {
                // Never one of the two recent slots: they were used last.
                (0..self.slots.len())
                    .min_by_key(|&k| self.slots[k].used)
                    .unwrap_or(0)
            };
            let slot = &mut self.slots[k];
            (slot.store, slot.chunk) = (store.id, chunk);
            let scratch = self.scratch.get_or_insert_with(|| {
                Box::new(Scratch {
                    packed: Vec::new(),
                    rows: Vec::new(),
                })
            });
            store.load(chunk, scratch, &mut slot.data);
            k
        };
        // The slot that drops out of the recent two keeps the tick of its
        // last use; these two are the newest.
        if self.last[0] != k {
            self.last = [k, self.last[0]];
        }
        self.slots[k].used = self.tick;
        if let Some(s) = self.slots.get_mut(self.last[1]) {
            s.used = self.tick;
        }
        k
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

/// Chunks this thread holds of records of type `T`, over all stores.
#[cfg(test)]
pub fn cached_chunks<T: Record>() -> usize {
    T::cache().with(|c| c.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Default, Debug, PartialEq)]
    struct R(u64, u32);

    impl Record for R {
        const SIZE: usize = 12;
        fn put(&self, out: &mut [u8]) {
            out[..8].copy_from_slice(&self.0.to_le_bytes());
            out[8..12].copy_from_slice(&self.1.to_le_bytes());
        }
        fn take(b: &[u8]) -> Self {
            R(
                u64::from_le_bytes(b[..8].try_into().unwrap()),
                u32::from_le_bytes(b[8..12].try_into().unwrap()),
            )
        }
        chunk_cache!(R);
    }

    #[test]
    fn holds_one_partial_chunk_and_reads_back_every_record() {
        let n = CHUNK * 5 + 17;
        let mut s = Spill::<R>::default();
        for i in 0..n {
            s.push(R(i as u64 * 3, i as u32)).unwrap();
            // Memory held by the store never exceeds one chunk.
            assert!(s.resident() < CHUNK);
        }
        assert_eq!((s.len(), s.spilled_chunks(), s.resident()), (n, 5, 17));
        // In order, then backwards, then strided: every record as written.
        for i in (0..n).chain((0..n).rev()).chain((0..n).step_by(997)) {
            assert_eq!(s.get(i), R(i as u64 * 3, i as u32));
        }
        assert!(cached_chunks::<R>() <= CACHED_CHUNKS);
    }

    #[test]
    fn the_cache_stays_bounded_over_many_chunks() {
        let chunks = CACHED_CHUNKS + 10;
        let mut s = Spill::<R>::default();
        for i in 0..chunks * CHUNK {
            s.push(R(i as u64, 0)).unwrap();
        }
        for i in (0..s.len()).step_by(CHUNK / 2) {
            assert_eq!(s.get(i).0, i as u64);
        }
        assert_eq!(cached_chunks::<R>(), CACHED_CHUNKS);
    }

    #[test]
    fn compressed_chunks_are_smaller_and_read_back_as_written() {
        // Repetitive records (ids, small counts) compress; a chunk of
        // random bytes does not, and must still read back.
        // Record `i`, the random ones from an xorshift state `x`.
        fn record(i: usize, x: &mut u64) -> R {
            if i < CHUNK * 2 {
                return R((i / 64) as u64, 7);
            }
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            R(*x, (*x >> 32) as u32)
        }
        const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut s = Spill::<R>::default();
        let mut x = SEED;
        for i in 0..CHUNK * 3 {
            s.push(record(i, &mut x)).unwrap();
        }
        let raw = (CHUNK * R::SIZE) as u64;
        assert!(s.at[1] - s.at[0] < raw / 4, "{:?}", s.at);
        assert!(s.at[3] - s.at[2] >= raw, "{:?}", s.at);
        let mut x = SEED;
        let mut out = Vec::new();
        s.get_range(0..s.len(), &mut out);
        for (i, r) in out.into_iter().enumerate() {
            assert_eq!(r, record(i, &mut x), "record {i}");
        }
    }

    /// Written as they are, not compressed.
    #[derive(Clone, Copy, Default, Debug, PartialEq)]
    struct Raw(u64);

    impl Record for Raw {
        const SIZE: usize = 8;
        const COMPRESS: bool = false;
        fn put(&self, out: &mut [u8]) {
            out.copy_from_slice(&self.0.to_le_bytes());
        }
        fn take(b: &[u8]) -> Self {
            Raw(u64::from_le_bytes(b.try_into().unwrap()))
        }
        chunk_cache!(Raw);
    }

    #[test]
    fn uncompressed_records_read_back_as_written() {
        let n = CHUNK * 3 + 5;
        let mut s = Spill::<Raw>::default();
        for i in 0..n {
            s.push(Raw(i as u64 * 7)).unwrap();
        }
        assert_eq!(s.spilled_chunks(), 3);
        // Each chunk takes its records' bytes in the file.
        assert_eq!(s.at, [0, 1, 2, 3].map(|k| (k * CHUNK * Raw::SIZE) as u64));
        for i in (0..n).rev().chain(0..n) {
            assert_eq!(s.get(i), Raw(i as u64 * 7));
        }
        let mut out = Vec::new();
        s.get_range(CHUNK - 2..2 * CHUNK + 3, &mut out);
        assert_eq!(out.len(), CHUNK + 5);
        assert!(out
            .iter()
            .zip(CHUNK - 2..)
            .all(|(r, i)| r.0 == i as u64 * 7));
    }
}
