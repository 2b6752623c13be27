use super::*;

fn settings(dir: &std::path::Path) -> Settings {
    Settings {
        per_signature: 1,
        recheck_per_step: 0,
        max_bytes: 1000,
        budget: Duration::from_secs(10),
        wait: Duration::ZERO,
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
        outer: Vec::new(),
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
        informative: true,
        why: String::new(),
        elements: Vec::new(),
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
    // "b", skipped for the queue and then the budget, counts once, for the
    // budget; both are listed, in the order first skipped.
    assert_eq!(
        s["unchecked"],
        serde_json::json!([
            {"signature": "b", "op": "aten::mm", "overload": "default", "why": "budget"},
            {"signature": "c", "op": "aten::mm", "overload": "default", "why": "budget"},
        ]),
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

fn element(index: u32, name: &str, device_err: f64) -> ElementMeasure {
    ElementMeasure {
        index,
        name: name.into(),
        device_err,
        cpu_err: 2e-8,
        device_vs_cpu: device_err,
        device_ulp: 1.0,
        cpu_ulp: 0.5,
        float_input_shapes: vec![vec![4, 8], vec![4, 8]],
        out_numel: 32,
        informative: true,
        why: String::new(),
    }
}

#[test]
fn a_list_op_gets_a_line_per_index_named_by_its_parameter() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(settings(d.path()));
    let id = c.wanted(
        "aten::_foreach_lerp_.Scalar([float32[4, 8], float32[4, 8]], ...)",
        512,
        call("aten::_foreach_lerp_", 5),
    );
    let mut m = measured(-1.0, -1.0, 0.1);
    m.elements = vec![element(0, "emb.weight.grad", 3e-8), element(1, "", 1e-3)];
    assert!(c.measured(id, m), "index 1 failed: its capture is wanted");
    c.captured(id, None);
    c.finish();
    assert!(c.sync(Duration::from_secs(10)));
    let rows = lines(d.path());
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(
        (&rows[0]["element"], &rows[0]["name"], &rows[0]["verdict"]),
        (
            &serde_json::json!(0),
            &serde_json::json!("emb.weight"),
            &serde_json::json!("pass")
        )
    );
    assert_eq!(
        (&rows[1]["element"], &rows[1]["name"], &rows[1]["verdict"]),
        (
            &serde_json::json!(1),
            &serde_json::Value::Null,
            &serde_json::json!("fail")
        )
    );
    let s = &rows[2];
    assert_eq!(
        (s["checked"].as_u64(), s["failed"].as_u64()),
        (Some(2), Some(1)),
        "{s}"
    );
}

/// A call of `sig` in `step`: whether it is checked.
fn at(c: &Checks, sig: &str, step: i64) -> bool {
    let mut info = call("aten::mul", step);
    info.step = step;
    let id = c.wanted(sig, 8, info);
    if id >= 0 {
        assert!(!c.measured(id, measured(1e-8, 1e-8, 0.0)));
    }
    id >= 0
}

#[test]
fn checked_signatures_are_checked_again_in_turn_one_per_step() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(Settings {
        recheck_per_step: 1,
        ..settings(d.path())
    });
    // Step 0 checks a, b, c (and a setup op met only then).
    for sig in ["setup", "a", "b", "c"] {
        assert!(at(&c, sig, 0));
    }
    // Each later step checks one of a, b, c again, in turn; the setup op,
    // gone since step 0, takes step 1 and then leaves the rotation.
    let mut again = Vec::new();
    for step in 1..=6 {
        for sig in ["a", "b", "c"] {
            if at(&c, sig, step) {
                again.push((step, sig));
            }
        }
    }
    assert_eq!(again, [(2, "a"), (3, "b"), (4, "c"), (5, "a"), (6, "b")]);
    // Met again, it is back in turn.
    let mut later = Vec::new();
    for step in 7..=10 {
        for sig in ["setup", "a", "b", "c"] {
            if at(&c, sig, step) {
                later.push(sig);
            }
        }
    }
    assert_eq!(later, ["c", "a", "b", "setup"]);
    c.finish();
    assert!(c.sync(Duration::from_secs(10)));
    let s = lines(d.path()).pop().unwrap();
    assert_eq!(s["rechecks"].as_u64(), Some(9), "{s}");
    assert_eq!(s["signatures"].as_u64(), Some(4), "{s}");
}

#[test]
fn no_recheck_with_zero_and_never_of_a_signature_without_a_reference() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(settings(d.path()));
    assert!(at(&c, "a", 0));
    assert!((1..5).all(|step| !at(&c, "a", step)));
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(Settings {
        recheck_per_step: 1,
        ..settings(d.path())
    });
    let id = c.wanted("nofloat", 8, call("aten::argmax", 0));
    let mut m = measured(-1.0, -1.0, 0.0);
    m.why = "no floating-point output to compare".into();
    assert!(!c.measured(id, m));
    assert!((1..5).all(|step| !at(&c, "nofloat", step)));
    assert!(c.wanted("drop", 8, call("aten::native_dropout", 0)) < 0);
    assert!((1..5).all(|step| c.wanted("drop", 8, call("aten::native_dropout", step)) < 0));
}

#[test]
fn floats_are_their_type_in_a_signature_and_dims_flags_and_modes_their_value() {
    let sig = |args: &str| {
        signature_kind(&format!("aten::x.default(float32[4]; {args})"), args).into_owned()
    };
    assert_eq!(
        sig("scalars=[-0.0012, -0.001, 1e-08], alpha=1"),
        "aten::x.default(float32[4]; scalars=float[3], alpha=1)"
    );
    assert_eq!(
        sig("lr=0.01, beta1=0.9, amsgrad=False, eps=1e-08"),
        "aten::x.default(float32[4]; lr=float, beta1=float, amsgrad=False, eps=float)"
    );
    // Two steps' bias corrections make one signature.
    assert_eq!(sig("weight=0.09999999999999998"), sig("weight=0.19"));
    for same in [
        "dim=[0, 1], keepdim=True",
        "approximate='tanh'",
        "dtype=float32",
        "p=inf",
    ] {
        let kept = sig(same);
        if same == "p=inf" {
            assert!(kept.ends_with("p=float)"), "{kept}");
        } else {
            assert!(kept.ends_with(&format!("{same})")), "{kept}");
        }
    }
    assert_eq!(
        sig("record=<__torch__.R object at 0x5649051c3e20>"),
        sig("record=<__torch__.R object at 0x56490717df50>")
    );
    assert!(sig("record=<__torch__.R object at 0x1>").ends_with("record=<__torch__.R object>)"));
    assert_eq!(
        signature_kind("aten::mm.default(float32[4, 4], float32[4, 4])", ""),
        "aten::mm.default(float32[4, 4], float32[4, 4])"
    );
}

#[test]
fn a_check_that_saw_only_zeros_is_made_again_at_a_later_call() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(settings(d.path()));
    let sig = "aten::_foreach_mul_.Scalar(float32[][2], float)";
    let zeros = Measured {
        informative: false,
        ..measured(0.0, 0.0, 0.01)
    };
    // Adam's first step scales second moments that are still zero.
    let id = c.wanted(sig, 10, call("aten::_foreach_mul_", 1));
    assert!(id >= 0);
    assert!(!c.measured(id, zeros.clone()));
    // Its next call, with values, is checked, and one with values ends it.
    let id = c.wanted(sig, 10, call("aten::_foreach_mul_", 2));
    assert!(id >= 0, "a check on zeros counts for nothing");
    assert!(!c.measured(id, measured(3e-8, 2e-8, 0.01)));
    assert_eq!(c.wanted(sig, 10, call("aten::_foreach_mul_", 3)), -1);

    // An op whose outputs are always zero is given up after the retries.
    let sig = "aten::zero_.default(float32[4, 8])";
    let mut checked = 0;
    for seq in 10..20 {
        let id = c.wanted(sig, 10, call("aten::zero_", seq));
        if id >= 0 {
            checked += 1;
            assert!(!c.measured(id, zeros.clone()));
        }
    }
    assert_eq!(checked, 1 + UNINFORMATIVE_RETRIES);
}

/// A call whose copies find the queue full: `wanted` on another thread.
fn wanted_in_thread<'a>(
    scope: &'a std::thread::Scope<'a, '_>,
    c: &'a Checks,
    sig: &'static str,
    info: CallInfo,
) -> std::thread::ScopedJoinHandle<'a, (i64, Duration)> {
    // The thread says it started, so that the caller's sleep begins after
    // its clock does: on a loaded machine it may start late.
    let (started, on_start) = std::sync::mpsc::channel();
    let handle = scope.spawn(move || {
        let t0 = Instant::now();
        let _ = started.send(());
        let id = c.wanted(sig, 900, info);
        (id, t0.elapsed())
    });
    on_start.recv().unwrap();
    handle
}

fn summary_of(d: &std::path::Path) -> serde_json::Value {
    let s = lines(d).pop().unwrap();
    assert_eq!(s["kind"], "summary", "{s}");
    s
}

#[test]
fn a_call_that_finds_the_queue_full_waits_until_a_check_frees_room() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(Settings {
        wait: Duration::from_secs(30),
        ..settings(d.path())
    });
    // 4 x 900 bytes of copies wait; a second call's do not fit (4 x 1000).
    let a = c.wanted("a", 900, call("aten::mm", 1));
    assert!(a >= 0);
    std::thread::scope(|scope| {
        let b = wanted_in_thread(scope, &c, "b", call("aten::mm", 2));
        std::thread::sleep(Duration::from_millis(200));
        assert!(!b.is_finished(), "the call waits while the queue is full");
        // The checking thread is through with "a": room for "b".
        assert!(!c.measured(a, measured(1e-8, 1e-8, 0.01)));
        let (id, waited) = b.join().unwrap();
        assert!(id >= 0, "the waiting call is checked");
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(20), "{waited:?}");
        assert!(!c.measured(id, measured(1e-8, 1e-8, 0.01)));
    });
    c.finish();
    assert!(c.sync(Duration::from_secs(10)));
    let s = summary_of(d.path());
    assert_eq!(
        (
            s["checked"].as_u64(),
            s["skipped_busy"].as_u64(),
            s["waits"].as_u64()
        ),
        (Some(2), Some(0), Some(1)),
        "{s}"
    );
    assert!(s["wait_seconds"].as_f64().unwrap() >= 0.2, "{s}");
    assert_eq!(s["unchecked"], serde_json::json!([]), "{s}");
}

#[test]
fn a_wait_that_times_out_skips_the_call_and_lists_its_signature_until_checked() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(Settings {
        wait: Duration::from_millis(300),
        ..settings(d.path())
    });
    let a = c.wanted("a", 900, call("aten::mm", 1));
    assert!(a >= 0);
    let t0 = Instant::now();
    assert_eq!(c.wanted("b", 900, call("aten::mm", 2)), -1);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    // No check finished during the wait: the checking thread is stalled,
    // and the next call does not wait for it.
    let t0 = Instant::now();
    assert_eq!(c.wanted("c", 900, call("aten::add", 3)), -1);
    assert!(
        t0.elapsed() < Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    assert!(!c.measured(a, measured(1e-8, 1e-8, 0.01)));
    // Skipped, not dropped: the next call of "c" is checked, and "c" is no
    // longer listed; "b" is never met again.
    let id = c.wanted("c", 900, call("aten::add", 4));
    assert!(id >= 0);
    assert!(!c.measured(id, measured(1e-8, 1e-8, 0.01)));
    c.finish();
    assert!(c.sync(Duration::from_secs(10)));
    let s = summary_of(d.path());
    assert_eq!(
        (
            s["signatures"].as_u64(),
            s["skipped_busy"].as_u64(),
            s["waits"].as_u64()
        ),
        (Some(3), Some(1), Some(1)),
        "{s}"
    );
    assert!(s["wait_seconds"].as_f64().unwrap() >= 0.3, "{s}");
    assert_eq!(
        s["unchecked"],
        serde_json::json!([{"signature": "b", "op": "aten::mm", "overload": "default", "why": "busy"}]),
        "{s}"
    );
}

#[test]
fn a_call_never_waits_for_the_checks_of_the_calls_it_is_inside() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(Settings {
        wait: Duration::from_secs(30),
        ..settings(d.path())
    });
    // aten::linear's check is handed over after it returns: its kernel,
    // inside it, would wait for itself.
    let linear = c.wanted("linear", 900, call("aten::linear", 1));
    assert!(linear >= 0);
    let inner = CallInfo {
        outer: vec![1],
        ..call("aten::addmm", 2)
    };
    let t0 = Instant::now();
    assert_eq!(c.wanted("addmm", 900, inner), -1);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // A call of another thread, or after linear returned, waits for it.
    std::thread::scope(|scope| {
        let other = wanted_in_thread(scope, &c, "addmm", call("aten::addmm", 3));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!other.is_finished());
        c.dropped(linear, false);
        assert!(other.join().unwrap().0 >= 0);
    });
}

#[test]
fn a_recheck_never_waits() {
    let d = tempfile::tempdir().unwrap();
    let c = Checks::new(Settings {
        wait: Duration::from_secs(30),
        recheck_per_step: 1,
        ..settings(d.path())
    });
    assert!(at(&c, "a", 0));
    let mut info = call("aten::mm", 10);
    info.step = 1;
    let pending = c.wanted("big", 900, info);
    assert!(pending >= 0);
    let mut again = call("aten::mul", 11);
    again.step = 1;
    let t0 = Instant::now();
    assert_eq!(c.wanted("a", 900, again), -1);
    assert!(t0.elapsed() < Duration::from_secs(5));
}
