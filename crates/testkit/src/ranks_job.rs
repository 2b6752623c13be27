//! A small data-parallel job, one dump per rank, with fingerprints: for
//! tests of `opdump ranks` (three linear layers, a buffer each rank updates
//! from its own data, a backward and an optimizer step).

use std::path::Path;

use opdump_format::{Phase, TensorRecord};

use crate::synth::{input, output, DumpWriter};

const LAYERS: usize = 3;
const STEPS: i64 = 3;

/// A grad fingerprint changed on one rank at one step.
#[derive(Clone, Copy)]
pub struct Flip {
    pub rank: u32,
    pub step: i64,
    pub layer: usize,
}

/// A data-parallel job of `ranks` ranks.
#[derive(Clone, Copy, Default)]
pub struct Job {
    pub ranks: u32,
    pub flip: Option<Flip>,
    /// Rank 3 makes extra calls (one unnamed, one reading a parameter
    /// through an op no other rank calls): they must shift nothing.
    pub extra_calls: bool,
    /// Write no fingerprints (a dump from before they were computed).
    pub no_fingerprints: bool,
}

fn h(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn named(mut t: TensorRecord, name: &str, fp: u64, job: &Job) -> TensorRecord {
    t.name = Some(name.to_string());
    t.fingerprint = (!job.no_fingerprints).then_some(fp);
    t
}

fn listed(mut t: TensorRecord, i: usize) -> TensorRecord {
    t.list_index = Some(i as i32);
    t
}

/// One rank's run. A parameter's fingerprint evolves with the gradients it
/// is given, so a flipped gradient makes the rank's parameters differ from
/// then on, as in a real job.
pub fn write_rank(root: &Path, rank: u32, job: &Job) -> opdump_format::Result<()> {
    let mut w = DumpWriter::new(root, rank, "cpu");
    let mut params: Vec<u64> = (0..LAYERS).map(|l| h(1, l as u64)).collect();
    for step in 0..STEPS {
        w.step = step;
        w.phase = Phase::Forward;
        for (l, &p) in params.iter().enumerate() {
            w.module = Some(format!("fc{l}"));
            let weight = named(
                input("weight", "float32", &[4, 4], 1.0),
                &format!("fc{l}.weight"),
                p,
                job,
            );
            let x = input("input", "float32", &[2, 4], 1.0);
            w.leaf(
                "aten::linear",
                "default",
                "",
                vec![x, weight],
                vec![output(0, "float32", &[2, 4], 1.0)],
            )?;
            if job.extra_calls && rank == 3 && step == 1 && l == 1 {
                w.leaf(
                    "aten::detach",
                    "default",
                    "",
                    vec![input("self", "float32", &[4], 1.0)],
                    vec![],
                )?;
                let again = named(
                    input("self", "float32", &[4, 4], 1.0),
                    &format!("fc{l}.weight"),
                    p,
                    job,
                );
                w.leaf("aten::alias", "default", "", vec![again], vec![])?;
            }
        }
        // A buffer each rank updates from its own data: it differs on all.
        w.module = Some("bn".into());
        let buf = named(
            input("running_mean", "float32", &[4], 1.0),
            "bn.running_mean",
            h(rank as u64 + 7, step as u64),
            job,
        );
        w.leaf(
            "aten::_native_batch_norm_legit",
            "default",
            "",
            vec![buf],
            vec![],
        )?;
        w.module = None;
        w.phase = Phase::Backward;
        w.leaf(
            "aten::mm",
            "default",
            "",
            vec![input("self", "float32", &[4, 4], 1.0)],
            vec![output(0, "float32", &[4, 4], 1.0)],
        )?;
        w.phase = Phase::Optimizer;
        let grads: Vec<u64> = (0..LAYERS)
            .map(|l| {
                let g = h(2 + step as u64, l as u64);
                match job.flip {
                    Some(f) if f.rank == rank && f.step == step && f.layer == l => g ^ 1,
                    _ => g,
                }
            })
            .collect();
        let mut ins = Vec::new();
        let mut outs = Vec::new();
        for l in 0..LAYERS {
            let (pn, gn) = (format!("fc{l}.weight"), format!("fc{l}.weight.grad"));
            ins.push(listed(
                named(input("self", "float32", &[4, 4], 1.0), &pn, params[l], job),
                l,
            ));
            ins.push(listed(
                named(input("other", "float32", &[4, 4], 1.0), &gn, grads[l], job),
                l,
            ));
            params[l] = h(params[l], grads[l]);
            let mut o = named(input("self", "float32", &[4, 4], 1.0), &pn, params[l], job);
            o.role = opdump_format::Role::Output;
            outs.push(listed(o, l));
        }
        w.leaf("aten::_foreach_add_", "List", "alpha=-0.1", ins, outs)?;
    }
    w.close()?;
    Ok(())
}

/// Every rank of `job`.
pub fn write_job(root: &Path, job: &Job) -> opdump_format::Result<()> {
    for r in 0..job.ranks {
        write_rank(root, r, job)?;
    }
    Ok(())
}
