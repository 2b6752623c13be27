//! The record of one op call, as the plugin hands it to the writer.

use std::borrow::Cow;

/// A name that repeats from record to record: an op, an overload, an
/// argument, a dtype, a device, a module path. The plugin's records borrow
/// names interned for the life of the process (one allocation per distinct
/// name, not per record); records read back or built by hand own theirs.
pub type Name = Cow<'static, str>;

/// Where an op call ran: the autograd engine's backward functions, inside
/// `Optimizer.step`, or anywhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "forward" => Phase::Forward,
            "backward" => Phase::Backward,
            "optimizer" => Phase::Optimizer,
            _ => return None,
        })
    }
}

/// The tensor's place in the call. `None` marks the single row of an op
/// without tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Role {
    Input,
    Output,
    None,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Output => "output",
            Role::None => "none",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "input" => Role::Input,
            "output" => Role::Output,
            "none" => Role::None,
            _ => return None,
        })
    }
}

/// Why the statistics of a tensor are what they are; a reader uses it to tell
/// a null statistic that was never measured from one that cannot exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum StatsStatus {
    /// Measured on the tensor's device.
    Computed,
    /// The memory holds no values yet (`empty`, the pre-op value of `fill_`'s
    /// or an out= argument, ...).
    Uninitialized,
    /// Metadata only: meta, fake, sparse, quantized, nested or storage-less.
    Unsupported,
    /// Copied from the record of the op that produced this unmodified tensor.
    Reused,
    /// Copied from the input of a view of exactly its elements (in any order,
    /// or broadcast: counts and l2 scaled by the repeat).
    View,
    /// Not measured on purpose (inputs switched off, asynchronous outputs).
    NotMeasured,
    /// Measuring failed; the op itself ran normally.
    Failed,
    /// Not measured: the device's current stream was capturing a graph (CUDA
    /// graphs), when opdump launches nothing.
    Capturing,
    /// Not measured: the pool of device results waiting to come back stayed
    /// full (OPDUMP_QUEUE_FULL); counted and reported.
    Dropped,
}

impl StatsStatus {
    pub const ALL: [StatsStatus; 9] = [
        StatsStatus::Computed,
        StatsStatus::Uninitialized,
        StatsStatus::Unsupported,
        StatsStatus::Reused,
        StatsStatus::View,
        StatsStatus::NotMeasured,
        StatsStatus::Failed,
        StatsStatus::Capturing,
        StatsStatus::Dropped,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            StatsStatus::Computed => "computed",
            StatsStatus::Uninitialized => "uninitialized",
            StatsStatus::Unsupported => "unsupported",
            StatsStatus::Reused => "reused",
            StatsStatus::View => "view",
            StatsStatus::NotMeasured => "not_measured",
            StatsStatus::Failed => "failed",
            StatsStatus::Capturing => "capturing",
            StatsStatus::Dropped => "dropped",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.as_str() == s)
    }
    /// Whether the statistics columns hold measured values.
    pub fn has_values(self) -> bool {
        matches!(
            self,
            StatsStatus::Computed | StatsStatus::Reused | StatsStatus::View
        )
    }
}

/// Statistics over the finite elements of a tensor. Generated from the
/// table of columns (`columns.rs`), one field per statistics column, so that
/// a statistic is declared once.
pub use crate::columns::Stats;

/// One tensor among an op call's arguments or results.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRecord {
    pub role: Role,
    /// The schema's argument name, or the return index for results.
    pub arg: Name,
    /// The position inside a `Tensor[]` argument or result.
    pub list_index: Option<i32>,
    pub dtype: Name,
    pub shape: Vec<i64>,
    pub stride: Vec<i64>,
    /// As torch prints it: `cpu`, `cuda:0`.
    pub device: Name,
    pub numel: i64,
    pub status: StatsStatus,
    /// Meaningful only when `status.has_values()`.
    pub stats: Stats,
    /// The parameter or buffer this tensor is, by its qualified name, or
    /// its gradient (`.grad` appended).
    pub name: Option<String>,
    /// In a captured call: the tensor's key in the capture file
    /// (`input.self`, `input.tensors.2`, `output.0`).
    pub capture_key: Option<String>,
    /// A 64-bit hash of the values in logical order, the same on every
    /// device (the README's "Fingerprint and sketch"); `None` where not
    /// measured. Meaningful only when `status.has_values()`.
    pub fingerprint: Option<u64>,
    /// K random ±1 projections of the values, accumulated in float64;
    /// `None` where not measured (or OPDUMP_SKETCH=0).
    pub sketch: Option<Vec<f64>>,
}

/// One tensor of a captured call, copied to the host: its values in its own
/// dtype, in logical (row-major) order.
#[derive(Clone, Debug, PartialEq)]
pub struct CapturedTensor {
    /// `input.<arg>[.<list index>]` or `output.<return index or written
    /// arg>[.<list index>]`.
    pub key: String,
    /// As the dump names dtypes: `float32`, `bfloat16`, `int64`.
    pub dtype: String,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

/// The full tensors of an op call chosen by `OPDUMP_CAPTURE`, written beside
/// the Parquet files as one safetensors file (see `capture.rs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Capture {
    /// The selector that chose the call, as written in `OPDUMP_CAPTURE`.
    pub selector: String,
    /// Every argument in schema order, typed, as JSON: what `opdump repro`
    /// needs to call the op again (`capture.rs` describes the form).
    pub args: String,
    /// Inputs as they were before the op ran, outputs after.
    pub tensors: Vec<CapturedTensor>,
    /// The outputs were left out: they would have taken the process past
    /// `OPDUMP_CAPTURE_MAX_BYTES`.
    pub outputs_skipped: bool,
    /// The file's name in its partition directory, once it is written.
    pub file: Option<String>,
}

/// One op call with its tensors. Written as one row per tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct OpRecord {
    /// Process-wide, unique, increasing in call (entry) order.
    pub seq: i64,
    pub parent_seq: Option<i64>,
    pub depth: i32,
    pub pid: i32,
    pub thread: i64,
    pub step: i64,
    pub phase: Phase,
    /// As the schema names it, without the overload: `aten::native_layer_norm`.
    pub op: Name,
    /// `Tensor`, `out`, ...; `default` for the unnamed overload.
    pub overload: Name,
    /// The non-tensor arguments as text.
    pub args: String,
    pub start_ns: i64,
    pub duration_ns: i64,
    /// The message of the exception the op raised, if it raised.
    pub error: Option<String>,
    /// The qualified path of the innermost module running the call; for a
    /// backward call, that of its forward call.
    pub module: Option<Name>,
    /// For a backward call: the seq of the forward call whose autograd node
    /// it runs.
    pub fwd_seq: Option<i64>,
    /// The innermost line of user code (OPDUMP_SOURCE=1).
    pub source: Option<String>,
    pub tensors: Vec<TensorRecord>,
    /// The call's full tensors, when `OPDUMP_CAPTURE` chose it.
    pub capture: Option<Capture>,
}

impl OpRecord {
    /// How many rows this record becomes in a file.
    pub fn row_count(&self) -> usize {
        self.tensors.len().max(1)
    }
}
