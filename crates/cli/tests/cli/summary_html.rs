//! `opdump summary --html FILE`: the page's module tree holds, per module
//! path and its ancestors, the op calls in it and its submodules and the
//! calls whose outputs held NaN or Inf, counted here from the calls written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::*;
use opdump_testkit::synth::{input, output, with_nan};

/// (module, op, NaN in the output, +Inf in the output) of each top-level
/// call.
const CALLS: &[(Option<&str>, &str, bool, bool)] = &[
    (Some("blocks.0.attn.q"), "aten::linear", false, false),
    (Some("blocks.0.mlp.fc1"), "aten::mul", false, false),
    (Some("blocks.0.mlp.act"), "aten::exp", false, true),
    (Some("blocks.0.mlp.act"), "aten::sub", true, false),
    (Some("blocks.1.mlp.fc1"), "aten::mul", true, false),
    (Some("blocks.1.mlp.fc1"), "aten::mul", false, false),
    (Some("head"), "aten::linear", false, false),
    (None, "aten::sum", true, false),
];

fn write_dump(root: &Path) -> PathBuf {
    let recs: Vec<_> = CALLS
        .iter()
        .enumerate()
        .map(|(seq, &(module, op, nan, inf))| {
            let mut r = record(seq as i64, None, op, 1.0);
            r.module = module.map(|m| m.to_string().into());
            let mut out = output(0, "float32", &[4, 8], 1.0);
            if nan {
                out = with_nan(out, 3);
            }
            if inf {
                out.stats.posinf_count = 2;
            }
            r.tensors = vec![input("self", "float32", &[4, 8], 1.0), out];
            r
        })
        .collect();
    let dir = root.join("dump");
    write_records(&dir, &recs);
    dir
}

/// Per module path and each of its ancestors: (calls, NaN out, Inf out),
/// from `CALLS`.
fn expected() -> BTreeMap<String, (u64, u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for &(module, _, nan, inf) in CALLS {
        // `(no module)` is one node; a path is one node per prefix.
        let paths: Vec<String> = match module {
            None => vec!["(no module)".into()],
            Some(path) => {
                let parts: Vec<&str> = path.split('.').collect();
                (1..=parts.len()).map(|k| parts[..k].join(".")).collect()
            }
        };
        for p in paths {
            let e = m.entry(p).or_default();
            e.0 += 1;
            e.1 += nan as u64;
            e.2 += inf as u64;
        }
    }
    m
}

/// Per `<details>` of the tree: its path, (calls, NaN out, Inf out), the
/// path of the node it is nested in, and whether it is open.
type Node = ((u64, u64, u64), Option<String>, bool);

fn tree_nodes(page: &str) -> BTreeMap<String, Node> {
    let mut nodes = BTreeMap::new();
    for (tag, parent) in details_tags(page) {
        let n = |a: &str| attr(tag, a).unwrap().parse::<u64>().unwrap();
        let path = attr(tag, "data-path").unwrap().to_string();
        let counts = (n("data-calls"), n("data-nan"), n("data-inf"));
        let node = (counts, parent, tag.contains(" open"));
        assert!(nodes.insert(path.clone(), node).is_none(), "{path} twice");
    }
    nodes
}

#[test]
fn module_tree_counts_calls_and_nan_inf_outputs_per_module() {
    let t = tmp();
    let dump = write_dump(t.path());
    let page = t.path().join("summary.html");
    let r = run(&["summary", path_str(&dump), "--html", path_str(&page)]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // The text report still goes to stdout.
    assert!(r.stdout.starts_with("opdump summary "), "{}", r.stdout);
    let page = std::fs::read_to_string(&page).unwrap();
    let nodes = tree_nodes(&page);
    let expected = expected();
    assert_eq!(
        nodes.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (path, (counts, parent, _)) in &nodes {
        assert_eq!(*counts, expected[path], "{path}");
        let up = path
            .rsplit_once('.')
            .filter(|_| path != "(no module)")
            .map(|(up, _)| up.to_string());
        assert_eq!(*parent, up, "{path}");
    }
    // NaN or Inf first came from finite inputs in blocks.0.mlp.act (exp's
    // +Inf): the path to it is open, the others closed.
    for p in ["blocks", "blocks.0", "blocks.0.mlp", "blocks.0.mlp.act"] {
        assert!(nodes[p].2, "{p} is on the path to the first Inf");
    }
    for p in ["blocks.1", "blocks.0.attn", "head"] {
        assert!(!nodes[p].2, "{p} is off the path");
    }
    assert!(page.contains("first NaN/Inf out: aten::exp <span class=\"dim\">seq 2, forward</span>"));
    assert!(page.contains(
        "<h3>First NaN from inputs without NaN</h3><p class=\"introduced\"><b>aten::sub</b>"
    ));
    // The totals agree with the per-op table, and the page is whole.
    assert!(page.contains("<td class=\"l\"><code>aten::mul</code></td><td>3</td>"));
    assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</body></html>\n"));
    assert!(!page.contains("<script"));
}

#[test]
fn a_dump_without_module_paths_says_so() {
    let t = tmp();
    let recs = vec![record(0, None, "aten::add", 1.0)];
    let dump = t.path().join("dump");
    write_records(&dump, &recs);
    let page = t.path().join("p.html");
    let r = run(&["summary", path_str(&dump), "--html", path_str(&page)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let page = std::fs::read_to_string(&page).unwrap();
    assert!(page.contains("<p>none: the dump has no module paths</p>"));
    assert!(!page.contains("<details"));
}
