//! The capture file of one op call chosen by `OPDUMP_CAPTURE`: its tensors in
//! the safetensors format, with what is needed to call the op again in the
//! file's metadata. Written beside the Parquet files of its partition as
//! `capture-<pid>-<N>.safetensors`, under a hidden name first and renamed
//! when complete (writer.rs), so that a crash never leaves a partial file.
//!
//! Tensors: `input.<arg>` (an element of a list: `input.<arg>.<i>`) as they
//! were before the op ran, `output.<i>` (or `output.<arg>` for an argument an
//! op writes without returning it) after; each in its own dtype and logical
//! shape, its values in row-major order.
//!
//! Metadata (all strings):
//! - `opdump.op`, `opdump.overload`, `opdump.selector`, `opdump.seq`,
//!   `opdump.step`, `opdump.phase`, `opdump.depth`, `opdump.pid`,
//!   `opdump.module` (when known);
//! - `opdump.args`: every argument in schema order, as JSON:
//!   `[{"name": "self", "kwarg_only": false, "value": V}, ...]` where V is
//!   `null`, `{"tensor": KEY}`, `{"tensors": [KEY or null, ...]}`,
//!   `{"int": 3}`, `{"float": 0.5}` (`"nan"`, `"inf"`, `"-inf"` as strings),
//!   `{"bool": true}`, `{"str": "tanh"}`, `{"ints": [...]}`,
//!   `{"floats": [...]}`, `{"bools": [...]}`, `{"complex": [re, im]}`,
//!   `{"dtype": "float32"}`, `{"layout": "strided"}`, `{"device": "cuda:0"}`,
//!   `{"memory_format": "contiguous_format"}`, `{"list": [V, ...]}`,
//!   `{"generator": null}` (the default generator is used again) or
//!   `{"unsupported": "<text>"}`;
//! - `opdump.tensors`: `{KEY: {"device": "cuda:0", "stride": [...]}}`, the
//!   device and strides each tensor had;
//! - `opdump.outputs_skipped`: `1` when the outputs were left out
//!   (`OPDUMP_CAPTURE_MAX_BYTES`); `opdump.unsaved`: keys of tensors whose
//!   dtype safetensors cannot hold, comma-separated.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};

use crate::record::{CapturedTensor, OpRecord};

/// Metadata keys of a capture file.
pub mod meta {
    pub const OP: &str = "opdump.op";
    pub const OVERLOAD: &str = "opdump.overload";
    pub const SELECTOR: &str = "opdump.selector";
    pub const SEQ: &str = "opdump.seq";
    pub const STEP: &str = "opdump.step";
    pub const PHASE: &str = "opdump.phase";
    pub const DEPTH: &str = "opdump.depth";
    pub const PID: &str = "opdump.pid";
    pub const MODULE: &str = "opdump.module";
    pub const ARGS: &str = "opdump.args";
    pub const TENSORS: &str = "opdump.tensors";
    pub const OUTPUTS_SKIPPED: &str = "opdump.outputs_skipped";
    pub const UNSAVED: &str = "opdump.unsaved";
}

/// The name of the `n`-th capture file of process `pid`.
pub fn file_name(pid: impl std::fmt::Display, n: u64) -> String {
    format!("capture-{pid}-{n:05}.safetensors")
}

/// The key of a tensor in a capture file, from its row: `input.self`,
/// `input.tensors.2`, `output.0`.
pub fn key(role: &str, arg: &str, list_index: Option<i32>) -> String {
    match list_index {
        Some(i) => format!("{role}.{arg}.{i}"),
        None => format!("{role}.{arg}"),
    }
}

/// The safetensors dtype of a dtype as the dump names it.
pub fn dtype_of(name: &str) -> Option<Dtype> {
    Some(match name {
        "bool" => Dtype::BOOL,
        "uint8" => Dtype::U8,
        "int8" => Dtype::I8,
        "int16" => Dtype::I16,
        "uint16" => Dtype::U16,
        "int32" => Dtype::I32,
        "uint32" => Dtype::U32,
        "int64" => Dtype::I64,
        "uint64" => Dtype::U64,
        "float16" => Dtype::F16,
        "bfloat16" => Dtype::BF16,
        "float32" => Dtype::F32,
        "float64" => Dtype::F64,
        "complex64" => Dtype::C64,
        "float8_e4m3fn" => Dtype::F8_E4M3,
        "float8_e5m2" => Dtype::F8_E5M2,
        _ => return None,
    })
}

/// The dtype as the dump names it, of a safetensors dtype.
pub fn dtype_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::BOOL => "bool",
        Dtype::U8 => "uint8",
        Dtype::I8 => "int8",
        Dtype::I16 => "int16",
        Dtype::U16 => "uint16",
        Dtype::I32 => "int32",
        Dtype::U32 => "uint32",
        Dtype::I64 => "int64",
        Dtype::U64 => "uint64",
        Dtype::F16 => "float16",
        Dtype::BF16 => "bfloat16",
        Dtype::F32 => "float32",
        Dtype::F64 => "float64",
        Dtype::C64 => "complex64",
        Dtype::F8_E4M3 => "float8_e4m3fn",
        Dtype::F8_E5M2 => "float8_e5m2",
        _ => return None,
    })
}

struct Saved<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl View for &Saved<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The bytes of the capture file of `rec`, which must hold a capture.
pub fn serialize(rec: &OpRecord) -> Result<Vec<u8>, String> {
    let cap = rec.capture.as_ref().ok_or("the call has no capture")?;
    let mut saved: Vec<(String, Saved<'_>)> = Vec::new();
    let mut unsaved: Vec<&str> = Vec::new();
    for t in &cap.tensors {
        let CapturedTensor {
            key,
            dtype,
            shape,
            data,
        } = t;
        let (Some(dt), Ok(shape)) = (
            dtype_of(dtype),
            shape
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>(),
        ) else {
            unsaved.push(key);
            continue;
        };
        let expected = shape.iter().product::<usize>() * dt.bitsize() / 8;
        if expected != data.len() {
            return Err(format!(
                "{key}: {} bytes for {dtype} {shape:?}, {expected} expected",
                data.len()
            ));
        }
        saved.push((
            key.clone(),
            Saved {
                dtype: dt,
                shape,
                data,
            },
        ));
    }
    // Where each tensor lived, from its row.
    let mut layout = Vec::new();
    for t in &rec.tensors {
        if let Some(k) = &t.capture_key {
            let strides: Vec<String> = t.stride.iter().map(i64::to_string).collect();
            layout.push(format!(
                "{}: {{\"device\": {}, \"stride\": [{}]}}",
                json_string(k),
                json_string(&t.device),
                strides.join(", ")
            ));
        }
    }
    let mut m: HashMap<String, String> = HashMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_string(), v);
    };
    put(meta::OP, rec.op.to_string());
    put(meta::OVERLOAD, rec.overload.to_string());
    put(meta::SELECTOR, cap.selector.clone());
    put(meta::SEQ, rec.seq.to_string());
    put(meta::STEP, rec.step.to_string());
    put(meta::PHASE, rec.phase.as_str().to_string());
    put(meta::DEPTH, rec.depth.to_string());
    put(meta::PID, rec.pid.to_string());
    if let Some(module) = &rec.module {
        put(meta::MODULE, module.to_string());
    }
    put(meta::ARGS, cap.args.clone());
    put(meta::TENSORS, format!("{{{}}}", layout.join(", ")));
    put(
        meta::OUTPUTS_SKIPPED,
        u8::from(cap.outputs_skipped).to_string(),
    );
    if !unsaved.is_empty() {
        put(meta::UNSAVED, unsaved.join(","));
    }
    let refs: Vec<(String, &Saved<'_>)> = saved.iter().map(|(k, s)| (k.clone(), s)).collect();
    safetensors::tensor::serialize(refs, Some(m)).map_err(|e| e.to_string())
}

/// A capture file read back.
pub struct CaptureFile {
    bytes: Vec<u8>,
    pub metadata: HashMap<String, String>,
}

/// One tensor of a capture file.
pub struct SavedTensor<'a> {
    /// As the dump names dtypes.
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl CaptureFile {
    /// Reads a regular file only (a FIFO planted under the name is an
    /// error, not a wait).
    pub fn open(path: &Path) -> Result<Self, String> {
        use std::io::Read;
        let mut bytes = Vec::new();
        crate::regular::open_regular(path)
            .map_err(|e| e.to_string())?
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Self::from_bytes(bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, String> {
        let (_, m) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| format!("not a safetensors file ({e})"))?;
        let metadata = m.metadata().clone().unwrap_or_default();
        SafeTensors::deserialize(&bytes).map_err(|e| format!("not a safetensors file ({e})"))?;
        Ok(CaptureFile { bytes, metadata })
    }

    /// The file as read.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The tensor saved under `key`.
    pub fn tensor(&self, key: &str) -> Option<SavedTensor<'_>> {
        let st = SafeTensors::deserialize(&self.bytes).ok()?;
        let v = st.tensor(key).ok()?;
        let dtype = dtype_name(v.dtype())?;
        let shape = v.shape().to_vec();
        let data = v.data();
        // `data` borrows from `self.bytes` through `st`: find it there.
        let start = data.as_ptr() as usize - self.bytes.as_ptr() as usize;
        Some(SavedTensor {
            dtype,
            shape,
            data: &self.bytes[start..start + data.len()],
        })
    }

    /// Every key in the file, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = SafeTensors::deserialize(&self.bytes)
            .map(|st| st.names().into_iter().map(str::to_string).collect())
            .unwrap_or_default();
        k.sort();
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Capture, Phase, Role, Stats, StatsStatus, TensorRecord};

    fn row(role: Role, arg: &str, key: &str) -> TensorRecord {
        TensorRecord {
            role,
            arg: arg.to_string().into(),
            list_index: None,
            dtype: "float32".into(),
            shape: vec![2, 2],
            stride: vec![1, 2],
            device: "cpu".into(),
            numel: 4,
            status: StatsStatus::Computed,
            stats: Stats::NONE,
            name: None,
            capture_key: Some(key.into()),
            fingerprint: None,
            sketch: None,
        }
    }

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn a_capture_round_trips_with_its_metadata() {
        let rec = OpRecord {
            seq: 7,
            parent_seq: None,
            depth: 0,
            pid: 42,
            thread: 1,
            step: 3,
            phase: Phase::Forward,
            op: "aten::gelu".into(),
            overload: "default".into(),
            args: "approximate=none".into(),
            start_ns: 0,
            duration_ns: 0,
            error: None,
            module: Some("blocks.0".into()),
            fwd_seq: None,
            source: None,
            tensors: vec![
                row(Role::Input, "self", "input.self"),
                row(Role::Output, "0", "output.0"),
            ],
            capture: Some(Capture {
                selector: "aten::gelu#0".into(),
                args: r#"[{"name": "approximate", "kwarg_only": true, "value": {"str": "none"}}]"#
                    .into(),
                tensors: vec![
                    CapturedTensor {
                        key: "input.self".into(),
                        dtype: "float32".into(),
                        shape: vec![2, 2],
                        data: bytes(&[1.0, -2.0, 3.5, 0.0]),
                    },
                    CapturedTensor {
                        key: "output.0".into(),
                        dtype: "float32".into(),
                        shape: vec![2, 2],
                        data: bytes(&[0.8, -0.04, 3.4, 0.0]),
                    },
                    CapturedTensor {
                        key: "input.odd".into(),
                        dtype: "complex128".into(),
                        shape: vec![1],
                        data: vec![0; 16],
                    },
                ],
                outputs_skipped: false,
                file: None,
            }),
        };
        let f = CaptureFile::from_bytes(serialize(&rec).unwrap()).unwrap();
        assert_eq!(f.keys(), ["input.self", "output.0"]);
        let x = f.tensor("input.self").unwrap();
        assert_eq!((x.dtype, x.shape.as_slice()), ("float32", &[2usize, 2][..]));
        assert_eq!(x.data, bytes(&[1.0, -2.0, 3.5, 0.0]).as_slice());
        assert_eq!(f.metadata[meta::OP], "aten::gelu");
        assert_eq!(f.metadata[meta::SEQ], "7");
        assert_eq!(f.metadata[meta::MODULE], "blocks.0");
        assert_eq!(f.metadata[meta::UNSAVED], "input.odd");
        assert_eq!(
            f.metadata[meta::TENSORS],
            r#"{"input.self": {"device": "cpu", "stride": [1, 2]}, "output.0": {"device": "cpu", "stride": [1, 2]}}"#
        );
        assert!(f.tensor("input.odd").is_none());
    }

    #[test]
    fn a_tensor_of_the_wrong_size_is_refused() {
        let mut rec = OpRecord {
            seq: 0,
            parent_seq: None,
            depth: 0,
            pid: 1,
            thread: 1,
            step: 0,
            phase: Phase::Forward,
            op: "aten::neg".into(),
            overload: "default".into(),
            args: String::new(),
            start_ns: 0,
            duration_ns: 0,
            error: None,
            module: None,
            fwd_seq: None,
            source: None,
            tensors: vec![],
            capture: Some(Capture::default()),
        };
        rec.capture.as_mut().unwrap().tensors.push(CapturedTensor {
            key: "input.self".into(),
            dtype: "float32".into(),
            shape: vec![3],
            data: vec![0; 8],
        });
        assert!(serialize(&rec).unwrap_err().contains("12 expected"));
    }
}
