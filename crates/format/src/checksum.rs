//! The checksum of each column chunk of a dump file, kept in the file's
//! key-value metadata ([`crate::schema::meta::CHUNK_CRC32`]).
//!
//! A bit flipped inside a data page (a bad disk, a copy gone wrong) most
//! often decodes without an error: Snappy copies literal bytes as they are,
//! and a float statistic then reads as another float, which a comparison
//! takes for a divergence. Parquet's page headers have a CRC field, but the
//! `parquet` crate (60) neither writes it nor lets a writer set it, so the
//! writer keeps one CRC-32 per column chunk itself, and the reader
//! (`opdump-load`) checks the chunks it reads before it decodes them.
//!
//! CRC-32 (IEEE, as zlib and Parquet's page CRC) detects every burst of up
//! to 32 flipped bits; slicing by 8 bytes keeps it above 1 GB/s (1.3 GB/s
//! on a loaded 2-core machine), a small part of decoding the same bytes.
//!
//! The sums hold for the chunks where the writer put them. A tool that
//! rewrites a dump file (pyarrow, a test forging a footer) must copy its
//! metadata for opdump to read it, and copies the sums with it; its chunks
//! lie elsewhere. So the value starts with a CRC of the chunks' places
//! ([`layout_sum`]): where the file's chunks are not where the sums were
//! taken, the sums are not this file's, and a reader leaves them unchecked.

/// The CRCs of one file's column chunks, with the CRC of their places.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkSums {
    pub layout: u32,
    /// One per column chunk: row group by row group, each row group's leaf
    /// columns in order.
    pub chunks: Vec<u32>,
}

/// The CRC of the chunks' places: each (start, length) in the file, as two
/// little-endian u64, in the order of [`ChunkSums::chunks`].
pub fn layout_sum(ranges: impl IntoIterator<Item = (u64, u64)>) -> u32 {
    let bytes: Vec<u8> = ranges
        .into_iter()
        .flat_map(|(s, l)| s.to_le_bytes().into_iter().chain(l.to_le_bytes()))
        .collect();
    crc32(&bytes)
}

impl ChunkSums {
    /// The metadata value: the layout's CRC, a colon, then the chunks'
    /// CRCs separated by commas, each as 8 hex digits.
    pub fn to_text(&self) -> String {
        let chunks: Vec<String> = self.chunks.iter().map(|s| format!("{s:08x}")).collect();
        format!("{:08x}:{}", self.layout, chunks.join(","))
    }

    /// The sums of [`ChunkSums::to_text`]'s text; `None` when it is not that.
    pub fn parse(text: &str) -> Option<ChunkSums> {
        let hex = |h: &str| {
            (h.len() == 8)
                .then(|| u32::from_str_radix(h, 16).ok())
                .flatten()
        };
        let (layout, chunks) = text.split_once(':')?;
        let chunks = if chunks.is_empty() {
            Vec::new()
        } else {
            chunks.split(',').map(hex).collect::<Option<_>>()?
        };
        Some(ChunkSums {
            layout: hex(layout)?,
            chunks,
        })
    }
}

/// Tables for slicing by 8: `TABLES[k][b]` is the CRC of byte `b` followed
/// by `k` zero bytes.
const TABLES: [[u32; 256]; 8] = tables();

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

/// CRC-32 (IEEE 802.3) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    let mut chunks = bytes.chunks_exact(8);
    for w in &mut chunks {
        let lo = c ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        c = TABLES[7][(lo & 0xff) as usize]
            ^ TABLES[6][((lo >> 8) & 0xff) as usize]
            ^ TABLES[5][((lo >> 16) & 0xff) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][w[4] as usize]
            ^ TABLES[2][w[5] as usize]
            ^ TABLES[1][w[6] as usize]
            ^ TABLES[0][w[7] as usize];
    }
    for &b in chunks.remainder() {
        c = (c >> 8) ^ TABLES[0][((c ^ b as u32) & 0xff) as usize];
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_the_ieee_crc() {
        // The check value of CRC-32/ISO-HDLC, and zlib's crc32 of these.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }

    #[test]
    fn every_single_bit_flip_changes_the_crc() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
        let sum = crc32(&data);
        for i in 0..data.len() * 8 {
            let mut d = data.clone();
            d[i / 8] ^= 1 << (i % 8);
            assert_ne!(crc32(&d), sum, "bit {i}");
        }
    }

    #[test]
    fn sums_round_trip_and_bad_text_is_none() {
        for chunks in [vec![0, 1, 0xdead_beef, u32::MAX], vec![]] {
            let sums = ChunkSums {
                layout: layout_sum([(4, 100), (104, 7)]),
                chunks,
            };
            assert_eq!(ChunkSums::parse(&sums.to_text()).unwrap(), sums);
        }
        for bad in [
            "",
            "00000000",
            "0000000:",
            "00000000:1",
            "00000000:0000000g",
            "00000000:00000000,",
            "00000000:,00000000",
            "00000000:000000000",
        ] {
            assert!(ChunkSums::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_layout_sum_tells_places_apart() {
        assert_ne!(layout_sum([(4, 100)]), layout_sum([(4, 101)]));
        assert_ne!(layout_sum([(4, 100)]), layout_sum([(5, 100)]));
        assert_ne!(
            layout_sum([(4, 10), (14, 20)]),
            layout_sum([(14, 20), (4, 10)])
        );
    }
}
