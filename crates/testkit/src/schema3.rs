//! Dumps as older writers left them, made from new ones: for the tests of
//! how the loader and the commands read files of an older schema.

use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use opdump_format::reader::list_files;
use opdump_format::schema::{col, meta};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;

/// Rewrites every file of a dump as schema 3 wrote it: no fingerprint, no
/// sketch column. Panics on any error (a test fixture).
pub fn strip_to_schema_3(dir: &Path) {
    for f in list_files(dir).unwrap() {
        let file = std::fs::File::open(&f.path).unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let kv: Vec<KeyValue> = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|kv| kv.key != meta::SCHEMA_VERSION && kv.key != "ARROW:schema")
            .collect();
        let batches: Vec<RecordBatch> = builder.build().unwrap().map(|b| b.unwrap()).collect();
        let keep: Vec<usize> = batches[0]
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, fl)| fl.name() != col::FINGERPRINT && fl.name() != col::SKETCH)
            .map(|(i, _)| i)
            .collect();
        let schema = Arc::new(batches[0].schema().project(&keep).unwrap());
        let out = std::fs::File::create(&f.path).unwrap();
        let mut w = ArrowWriter::try_new(out, schema.clone(), None).unwrap();
        for b in &batches {
            w.write(&b.project(&keep).unwrap()).unwrap();
        }
        for kv in kv {
            w.append_key_value_metadata(kv);
        }
        w.append_key_value_metadata(KeyValue::new(meta::SCHEMA_VERSION.into(), "3".to_string()));
        w.close().unwrap();
    }
}
