use super::*;

fn settings(dir: &std::path::Path) -> Settings {
    Settings {
        per_signature: 1,
        max_bytes: 1000,
        budget: Duration::from_secs(10),
        dir: dir.to_path_buf(),
        pid: 4242,
        file_mode: 0o600,
        dir_mode: 0o700,
        say: |_| {},
    }
}

fn call(op: &str, seq: i64) -> CallInfo {
    CallInfo {
        op: op.to_string(),
        overload: "default".to_string(),
        args: String::new(),
        module: Some("blocks.0".to_string()),
        phase: Phase::Backward,
        step: 1,
        seq,
        rank: 3,
    }
}

fn measured(device_err: f64, cpu_err: f64, seconds: f64) -> Measured {
    Measured {
        device: "testdev:0".into(),
        dtype: "float32".into(),
        device_err,
        cpu_err,
        device_vs_cpu: device_err,
        device_ulp: 1.0,
        cpu_ulp: 0.5,
        float_input_shapes: vec![vec![4, 8], vec![8, 2]],
        out_numel: 8,
        seconds,
        why: String::new(),
    }
}

fn lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let text =
        std::fs::read_to_string(dir.join("checks/rank=3/part-4242.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn each_signature_is_checked_once_and_judged_against_the_cpu() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(settings(d.path()));
    let id = c.wanted(
        "aten::mm.default(float32[4, 8], float32[8, 2])",
        10,
        call("aten::mm", 7),
    );
    assert!(id >= 0);
    assert_eq!(
        c.wanted(
            "aten::mm.default(float32[4, 8], float32[8, 2])",
            10,
            call("aten::mm", 9)
        ),
        -1
    );
    assert!(
        c.wanted(
            "aten::mm.default(float32[4, 9], float32[9, 2])",
            10,
            call("aten::mm", 11)
        ) >= 0
    );
    assert!(!c.measured(id, measured(3e-8, 2e-8, 0.1)));
    assert!(c.sync(Duration::from_secs(10)));
    let rows = lines(d.path());
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["verdict"], "pass");
    assert_eq!(r["module"], "blocks.0");
    assert_eq!(r["phase"], "backward");
    assert_eq!(r["seq"], 7);
    // mm contracts over 8: the reduction length, and no ULP for a contraction.
    assert_eq!(r["reduction_len"], 8.0);
    assert!(r["device_ulp"].is_null());
}

#[test]
fn a_fault_asks_for_its_capture_and_the_line_names_the_file() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(settings(d.path()));
    let id = c.wanted("aten::gelu.default(float32[8])", 32, call("aten::gelu", 1));
    assert!(c.measured(id, measured(1e-3, 3e-8, 0.1)));
    assert!(!c.idle(), "the check waits for its capture");
    c.captured(
        id,
        Some(Capture {
            selector: String::new(),
            args: "[]".into(),
            tensors: vec![opdump_format::CapturedTensor {
                key: "input.self".into(),
                dtype: "float32".into(),
                shape: vec![2],
                data: vec![0; 8],
            }],
            outputs_skipped: false,
            file: None,
        }),
    );
    assert!(c.idle());
    assert!(c.sync(Duration::from_secs(10)));
    let r = &lines(d.path())[0];
    assert_eq!(r["verdict"], "fail");
    assert!(r["ratio"].as_f64().unwrap() > 1e3);
    assert_eq!(r["device_ulp"], 1.0);
    let file = r["capture"].as_str().unwrap();
    assert_eq!(file, "checks/rank=3/capture-4242-00000.safetensors");
    let back = opdump_format::capture::CaptureFile::open(&d.path().join(file)).unwrap();
    assert!(back.tensor("input.self").is_some());
    assert_eq!(
        back.metadata[opdump_format::capture::meta::OP],
        "aten::gelu"
    );
}

#[test]
fn the_byte_cap_the_queue_and_the_budget_are_counted() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(settings(d.path()));
    // Over the cap: a no_reference line, never copied.
    assert_eq!(c.wanted("big", 1001, call("aten::mm", 1)), -1);
    // 4 x 900 bytes of copies wait; the next does not fit the queue (4 x
    // 1000) and is retried later.
    let a = c.wanted("a", 900, call("aten::mm", 2));
    assert!(a >= 0);
    assert_eq!(c.wanted("b", 900, call("aten::mm", 3)), -1);
    assert!(!c.measured(a, measured(1e-8, 1e-8, 20.0)));
    // The budget (10 s) is spent: nothing more is checked.
    assert_eq!(c.wanted("b", 900, call("aten::mm", 4)), -1);
    assert_eq!(c.wanted("c", 900, call("aten::mm", 5)), -1);
    c.finish();
    assert!(c.sync(Duration::from_secs(10)));
    let rows = lines(d.path());
    assert_eq!(rows[0]["verdict"], "no_reference");
    assert!(rows[0]["reason"]
        .as_str()
        .unwrap()
        .contains("OPDUMP_CHECK_MAX_BYTES"));
    let s = rows.last().unwrap();
    assert_eq!(s["kind"], "summary");
    assert_eq!(
        (
            s["signatures"].as_u64(),
            s["skipped_bytes"].as_u64(),
            s["skipped_busy"].as_u64(),
            s["skipped_budget"].as_u64()
        ),
        (Some(4), Some(1), Some(0), Some(2)),
        "{s}"
    );
}

#[test]
fn random_ops_have_no_reference_and_a_raising_op_is_checked_again() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(settings(d.path()));
    assert_eq!(c.wanted("drop", 8, call("aten::native_dropout", 1)), -1);
    let id = c.wanted("x", 8, call("aten::mm", 2));
    c.dropped(id, false);
    assert!(
        c.wanted("x", 8, call("aten::mm", 3)) >= 0,
        "the op raised: its next call is checked"
    );
    assert!(c.sync(Duration::from_secs(10)));
    assert_eq!(
        lines(d.path())[0]["reason"],
        "random op: another generator gives another right answer"
    );
}
