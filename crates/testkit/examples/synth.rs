//! Writes two synthetic dumps for timing `opdump compare`:
//!
//!     cargo run --release -p opdump-testkit --example synth -- /tmp/bench/a /tmp/bench/b [OP_CALLS]
//!     /usr/bin/time -v target/release/opdump compare /tmp/bench/a /tmp/bench/b
//!
//! A is a training run of OP_CALLS op calls (default 1,000,000) in 10 steps;
//! B is the same run on an "other device": rounding noise on every output,
//! an extra `_to_copy` before every 50th linear, a missing gelu every 97th
//! layer, layer_norm decomposed differently at depth 1, and a 1% fault in
//! one `addmm` of the last step, which compare must name.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use opdump_testkit::synth::{write_model, Model, Variant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: synth OUT_A OUT_B [OP_CALLS]");
        return ExitCode::from(2);
    }
    let (a, b) = (PathBuf::from(&args[0]), PathBuf::from(&args[1]));
    let calls: u64 = match args.get(2).map(|s| s.replace('_', "").parse()) {
        None => 1_000_000,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("synth: OP_CALLS must be a number");
            return ExitCode::from(2);
        }
    };
    for d in [&a, &b] {
        if d.exists() {
            eprintln!("synth: {} exists; remove it first", d.display());
            return ExitCode::from(2);
        }
    }
    let steps = 10;
    let per_layer_step = 19;
    let layers = ((calls / steps as u64).saturating_sub(6) / per_layer_step).max(1) as usize;
    let model = Model {
        steps,
        layers,
        tokens: 64,
        hidden: 128,
    };
    let fault_layer = layers / 2;
    let variant = Variant {
        noise: 1e-9,
        extra_copy_every: Some(50),
        drop_gelu_every: Some(97),
        decompose_layer_norm: true,
        fault: Some((steps - 1, fault_layer, 0.01)),
        ..Default::default()
    };
    let t = Instant::now();
    let (na, nb) = std::thread::scope(|s| {
        let ha = s.spawn(|| write_model(&a, &model, &variant, false, 500_000));
        let nb = write_model(&b, &model, &variant, true, 500_000);
        (ha.join(), nb)
    });
    match (na, nb) {
        (Ok(Ok(na)), Ok(nb)) => {
            eprintln!(
                "wrote {} op calls to {} and {} to {} in {:.1}s; planted: 1% in aten::addmm of step {}, layer {} (proj linear)",
                na,
                a.display(),
                nb,
                b.display(),
                t.elapsed().as_secs_f64(),
                steps - 1,
                fault_layer
            );
            ExitCode::SUCCESS
        }
        (Ok(Err(e)), _) | (_, Err(e)) => {
            eprintln!("synth: {e}");
            ExitCode::from(2)
        }
        (Err(_), _) => ExitCode::from(2),
    }
}
