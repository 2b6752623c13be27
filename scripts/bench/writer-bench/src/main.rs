//! Throughput of opdump's Parquet writer from a synthetic producer.
//!
//! Each op call has one input and one output tensor (2 rows), with op names,
//! argument strings, shapes and statistics that vary like a training run's.
//! Three measurements, each the median of `--runs` runs into a fresh
//! directory (files rotate at the plugin's default, 500,000 rows):
//!
//! - `producer only`: building the records, no writer (what the others include);
//! - `writer`: build + `RotatingWriter::append` on one thread, then close;
//! - `channel + writer thread`: build on this thread, send through a bounded
//!   crossbeam channel (16384, the plugin's OPDUMP_QUEUE) to a writer thread
//!   that appends, as `crates/engine/src/sink.rs` does; timed until the last file is complete.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use opdump_format::{
    OpRecord, Phase, Role, RotateOptions, RotatingWriter, Stats, StatsStatus, TensorRecord,
};

const OPS: &[(&str, &str, &str)] = &[
    ("aten::addmm", "default", "beta=1, alpha=1"),
    (
        "aten::native_layer_norm",
        "default",
        "normalized_shape=[128], eps=1e-05",
    ),
    ("aten::view", "default", "size=[16, 32, 128]"),
    ("aten::gelu", "default", "approximate='none'"),
    ("aten::add", "Tensor", "alpha=1"),
    ("aten::_softmax", "default", "dim=-1, half_to_float=False"),
    ("aten::mul_", "Tensor", ""),
    ("aten::addcdiv_", "default", "value=-0.001"),
];
const SHAPES: &[&[i64]] = &[
    &[16, 32, 128],
    &[512, 128],
    &[128],
    &[16, 4, 32, 32],
    &[384, 128],
];

fn stride(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn tensor(role: Role, arg: &'static str, shape: &[i64], x: f64) -> TensorRecord {
    let numel: i64 = shape.iter().product();
    TensorRecord {
        role,
        // Names borrowed for the life of the process, as the plugin's interned ones are.
        arg: arg.into(),
        list_index: None,
        dtype: "float32".into(),
        shape: shape.to_vec(),
        stride: stride(shape),
        device: "cpu".into(),
        numel,
        name: None,
        capture_key: None,
        status: StatsStatus::Computed,
        stats: Stats {
            min: -2.0 * x,
            max: 2.5 * x,
            mean: 0.01 * x,
            std: x,
            l2: x * (numel as f64).sqrt(),
            absmax: 2.5 * x,
            nan_count: 0,
            posinf_count: 0,
            neginf_count: 0,
            zero_count: (x * 7.0) as i64 % 3,
        },
        // OPDUMP_SKETCH's default: neither.
        fingerprint: None,
        sketch: None,
    }
}

/// The synthetic producer: op call `i`.
fn record(i: i64) -> OpRecord {
    let (op, overload, args) = OPS[(i as usize) % OPS.len()];
    let shape = SHAPES[(i as usize / 3) % SHAPES.len()];
    let x = 1.0 + (i % 1000) as f64 * 1e-3;
    OpRecord {
        seq: i,
        parent_seq: if i % 4 == 0 { None } else { Some(i - (i % 4)) },
        depth: (i % 4) as i32,
        pid: 4242,
        thread: 1,
        step: i / 2000,
        phase: match (i / 700) % 3 {
            0 => Phase::Forward,
            1 => Phase::Backward,
            _ => Phase::Optimizer,
        },
        op: op.into(),
        overload: overload.into(),
        args: args.to_string(),
        start_ns: 1_700_000_000_000_000_000 + i * 1500,
        duration_ns: 700 + i % 300,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        capture: None,
        tensors: vec![
            tensor(Role::Input, "self", shape, x),
            tensor(Role::Output, "0", shape, x * 1.1),
        ],
    }
}

fn writer(dir: &Path) -> RotatingWriter {
    RotatingWriter::new(
        dir.join("rank=0").join("device=cpu"),
        "part-4242",
        RotateOptions::default(),
        vec![],
    )
}

struct Run {
    secs: f64,
    rows: u64,
    files: u64,
    bytes: u64,
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += dir_bytes(&p);
            } else if let Ok(m) = e.metadata() {
                n += m.len();
            }
        }
    }
    n
}

fn run_producer(ops: i64) -> Run {
    let t = Instant::now();
    let mut rows = 0u64;
    for i in 0..ops {
        let r = std::hint::black_box(record(i));
        rows += r.row_count() as u64;
    }
    Run {
        secs: t.elapsed().as_secs_f64(),
        rows,
        files: 0,
        bytes: 0,
    }
}

fn run_writer(ops: i64, dir: &Path) -> Run {
    let t = Instant::now();
    let mut w = writer(dir);
    for i in 0..ops {
        w.append(&record(i)).expect("append");
    }
    w.close_file().expect("close");
    let secs = t.elapsed().as_secs_f64();
    Run {
        secs,
        rows: w.rows_written(),
        files: w.files_written(),
        bytes: dir_bytes(dir),
    }
}

fn run_channel(ops: i64, dir: &Path) -> Run {
    let t = Instant::now();
    let (tx, rx) = crossbeam_channel::bounded::<OpRecord>(16384);
    let d = dir.to_path_buf();
    let h = std::thread::Builder::new()
        .name("opdump-writer".into())
        .spawn(move || {
            let mut w = writer(&d);
            while let Ok(r) = rx.recv() {
                w.append(&r).expect("append");
            }
            w.close_file().expect("close");
            (w.rows_written(), w.files_written())
        })
        .expect("spawn");
    for i in 0..ops {
        if tx.send_timeout(record(i), Duration::from_secs(10)).is_err() {
            panic!("writer stalled");
        }
    }
    drop(tx);
    let (rows, files) = h.join().expect("writer thread");
    let secs = t.elapsed().as_secs_f64();
    Run {
        secs,
        rows,
        files,
        bytes: dir_bytes(dir),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

// The allocator the plugin uses (src/lib.rs), so the figures are the plugin's.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut ops: i64 = 1_000_000;
    let mut runs = 3;
    let mut dir: Option<PathBuf> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ops" => {
                ops = it
                    .next()
                    .and_then(|v| v.replace('_', "").parse().ok())
                    .expect("--ops N")
            }
            "--runs" => runs = it.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--dir" => dir = it.next().map(PathBuf::from),
            _ => {
                eprintln!("usage: writer-bench [--ops N] [--runs N] [--dir DIR]");
                std::process::exit(2);
            }
        }
    }
    let base = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("opdump-writer-bench-{}", std::process::id()))
    });
    println!("{} op calls × 2 tensors = {} rows per run; median of {} runs; files rotate every 500,000 rows", ops, 2 * ops, runs);
    println!();
    println!("| path | median s | rows/s | op calls/s | files | MiB written | runs (s) |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    type Bench = fn(i64, &Path) -> Run;
    let benches: [(&str, Bench); 3] = [
        ("producer only (build records)", |n, _| run_producer(n)),
        ("writer (build + RotatingWriter::append)", run_writer),
        ("channel + writer thread (as the plugin)", run_channel),
    ];
    for (name, f) in benches {
        let mut secs = Vec::new();
        let mut last = None;
        for k in 0..runs {
            let d = base.join(format!("run-{k}"));
            let _ = std::fs::remove_dir_all(&d);
            let r = f(ops, &d);
            let _ = std::fs::remove_dir_all(&d);
            secs.push(r.secs);
            last = Some(r);
        }
        let r = last.expect("one run");
        let m = median(secs.clone());
        let list: Vec<String> = secs.iter().map(|s| format!("{s:.2}")).collect();
        println!(
            "| {name} | {m:.2} | {:.0} | {:.0} | {} | {:.0} | {} |",
            r.rows as f64 / m,
            ops as f64 / m,
            r.files,
            r.bytes as f64 / (1 << 20) as f64,
            list.join(", ")
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
