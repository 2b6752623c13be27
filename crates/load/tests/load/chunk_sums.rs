//! Each column chunk is checked against the CRC the writer kept
//! (`opdump.chunk_crc32`) before it is decoded, in every row group of a
//! file: a flipped bit anywhere in a chunk that is read is one error that
//! names the file, the column and the row group.

use std::path::{Path, PathBuf};

use opdump_format::checksum::ChunkSums;
use opdump_format::schema::meta;
use opdump_judge::Silent;
use opdump_load::read::{load, scan};
use opdump_testkit::synth::{input, output, DumpWriter};
use parquet::file::reader::{FileReader, SerializedFileReader};

/// One file of 40,000 calls of two rows each: two row groups (the writer
/// starts one every 65,536 rows).
fn write_dump(root: &Path) -> PathBuf {
    let mut w = DumpWriter::new(root, 0, "cpu");
    for i in 0..40_000 {
        let x = 1.0 + (i % 97) as f64 / 7.0;
        w.leaf(
            "aten::gelu",
            "default",
            "",
            vec![input("self", "float32", &[4, 8], x)],
            vec![output(0, "float32", &[4, 8], x * 0.5)],
        )
        .expect("write");
    }
    w.close().expect("close");
    let dir = root.join("rank=0/device=cpu");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

fn load_error(root: &Path) -> Option<String> {
    let index = scan(root).expect("scan");
    load(&index, 0, &Silent, "test").err().map(|e| e.message)
}

#[test]
fn every_row_group_is_summed_and_checked() {
    let t = tempfile::tempdir().unwrap();
    let file = write_dump(t.path());
    let reader = SerializedFileReader::new(std::fs::File::open(&file).unwrap()).unwrap();
    let md = reader.metadata();
    assert!(
        md.num_row_groups() >= 2,
        "{} row groups",
        md.num_row_groups()
    );
    let text = md
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .iter()
        .find(|kv| kv.key == meta::CHUNK_CRC32)
        .and_then(|kv| kv.value.clone())
        .expect("the sums are in the footer");
    let sums = ChunkSums::parse(&text).expect("parse");
    let columns = md.file_metadata().schema_descr().num_columns();
    assert_eq!(sums.chunks.len(), md.num_row_groups() * columns);
    assert_eq!(load_error(t.path()), None);

    // A flipped bit in the second row group's `max` chunk.
    let rg = md.row_group(1);
    let chunk = rg
        .columns()
        .iter()
        .find(|c| c.column_path().string() == "max")
        .unwrap();
    let (start, len) = chunk.byte_range();
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[(start + len / 2) as usize] ^= 0x01;
    std::fs::write(&file, bytes).unwrap();
    let err = load_error(t.path()).expect("the flipped bit is found");
    assert!(
        err.contains("checksum") && err.contains("\"max\"") && err.contains("row group 1"),
        "{err}"
    );
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(!err.contains('\n'), "{err}");
}
