//! Writes synthetic multi-rank dumps for timing `opdump compare --rank all`
//! and `opdump ranks` (scripts/bench/fleet_scale.py runs it):
//!
//!     cargo run --release -p opdump-testkit --example synth_ranks -- \
//!         --ranks 64 --calls 200000 --a /tmp/fleet/a --b /tmp/fleet/b
//!     cargo run --release -p opdump-testkit --example synth_ranks -- \
//!         --ranks 256 --calls 100000 --a /tmp/fleet/r
//!
//! Every rank of A is the training run of `examples/synth.rs` with CALLS op
//! calls, its parameters named and fingerprinted; rank FAULT_RANK (default
//! the middle one) has an odd gradient at the last step, which `opdump
//! ranks` must name. Each rank of B (when `--b` is given) is that run on an
//! "other device" (noise, an extra copy, a missing gelu, layer_norm
//! decomposed), and B's FAULT_RANK also has a 1% fault in one `addmm` of
//! the last step, which `compare --rank all` must name. Ranks are written
//! `--threads` at a time (default the cores).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use opdump_testkit::synth::{write_model_rank, Model, RankOf, Variant};

struct Args {
    ranks: u32,
    calls: u64,
    a: PathBuf,
    b: Option<PathBuf>,
    fault_rank: Option<u32>,
    threads: usize,
}

const USAGE: &str = "usage: synth_ranks --ranks N --calls OP_CALLS --a OUT_A [--b OUT_B] [--fault-rank R] [--threads T]";

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut ranks, mut calls, mut a, mut b, mut fault_rank, mut threads) =
        (None, None, None, None, None, None);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || value.replace('_', "").parse::<u64>();
        let bad = |_| format!("{flag}: not a number: {value}");
        match flag.as_str() {
            "--ranks" => ranks = Some(number().map_err(bad)? as u32),
            "--calls" => calls = Some(number().map_err(bad)?),
            "--fault-rank" => fault_rank = Some(number().map_err(bad)? as u32),
            "--threads" => threads = Some(number().map_err(bad)? as usize),
            "--a" => a = Some(PathBuf::from(&value)),
            "--b" => b = Some(PathBuf::from(&value)),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(Args {
        ranks: ranks.ok_or("--ranks is required")?,
        calls: calls.ok_or("--calls is required")?,
        a: a.ok_or("--a is required")?,
        b,
        fault_rank,
        threads: threads.unwrap_or(cores).max(1),
    })
}

/// The model of `examples/synth.rs` at about `calls` op calls.
fn model(calls: u64) -> Model {
    let steps = 10;
    let layers = ((calls / steps as u64).saturating_sub(6) / 19).max(1) as usize;
    Model {
        steps,
        layers,
        tokens: 64,
        hidden: 128,
    }
}

/// B's differences on `rank`: device noise everywhere, the fault on one.
fn variant(m: &Model, faulty: bool) -> Variant {
    Variant {
        noise: 1e-9,
        extra_copy_every: Some(50),
        drop_gelu_every: Some(97),
        decompose_layer_norm: true,
        fault: faulty.then_some((m.steps - 1, m.layers / 2, 0.01)),
        ..Default::default()
    }
}

/// Writes every rank of one side, `threads` ranks at a time.
fn write_side(args: &Args, root: &Path, side_b: bool, fault_rank: u32) -> Result<u64, String> {
    let m = model(args.calls);
    let next = AtomicU32::new(0);
    let written = std::thread::scope(|s| {
        let workers: Vec<_> = (0..args.threads)
            .map(|_| {
                s.spawn(|| -> Result<u64, String> {
                    let mut n = 0;
                    loop {
                        let rank = next.fetch_add(1, Ordering::Relaxed);
                        if rank >= args.ranks {
                            return Ok(n);
                        }
                        let odd = rank == fault_rank;
                        let of = RankOf {
                            rank,
                            fingerprints: true,
                            odd_grad_at: odd.then_some(m.steps - 1),
                        };
                        let v = variant(&m, odd && side_b);
                        n += write_model_rank(root, &of, &m, &v, side_b, 500_000)
                            .map_err(|e| format!("rank {rank}: {e}"))?;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| "a writer panicked".to_string())?)
            .sum::<Result<u64, String>>()
    })?;
    Ok(written)
}

fn run(args: &Args) -> Result<(), String> {
    let fault_rank = args.fault_rank.unwrap_or(args.ranks / 2);
    let sides: Vec<(&PathBuf, bool)> = std::iter::once((&args.a, false))
        .chain(args.b.iter().map(|b| (b, true)))
        .collect();
    for (d, _) in &sides {
        if d.exists() {
            return Err(format!("{} exists; remove it first", d.display()));
        }
    }
    let m = model(args.calls);
    for (root, side_b) in sides {
        let t = Instant::now();
        let n = write_side(args, root, side_b, fault_rank)?;
        eprintln!(
            "wrote {n} op calls in {} ranks to {} in {:.1}s",
            args.ranks,
            root.display(),
            t.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "planted on rank {fault_rank}: an odd gradient of opt.0 at step {} (A and B){}",
        m.steps - 1,
        if args.b.is_some() {
            format!(
                "; in B, 1% in aten::addmm of step {}, layer {} (proj linear)",
                m.steps - 1,
                m.layers / 2
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("synth_ranks: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("synth_ranks: {e}");
            ExitCode::from(2)
        }
    }
}
