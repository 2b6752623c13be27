//! The HTML report's module tree: one node per module path of A's calls,
//! nested by path, each with the largest output error over its allowance
//! among its calls and its descendants'; and the headline call shown once
//! when it is also the first divergence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::*;
use opdump_testkit::synth::{input, output};

/// (module, op, scale in A, scale in B) of each top-level call.
const CALLS: &[(Option<&str>, &str, f64, f64)] = &[
    (Some("blocks.0.attn.q"), "aten::linear", 1.0, 1.0),
    (Some("blocks.0.mlp.fc1"), "aten::mul", 1.0, 1.0),
    // The fault: B doubles silu's output.
    (Some("blocks.0.mlp.act"), "aten::silu", 1.0, 2.0),
    (Some("blocks.1.mlp.fc1"), "aten::mul", 1.0, 1.0),
    (None, "aten::sum", 1.0, 1.0),
];

fn write_side(root: &Path, b_side: bool) -> PathBuf {
    let recs: Vec<_> = CALLS
        .iter()
        .enumerate()
        .map(|(seq, &(module, op, xa, xb))| {
            let mut r = record(seq as i64, None, op, 1.0);
            r.module = module.map(|m| m.to_string().into());
            let x = if b_side { xb } else { xa };
            r.tensors = vec![
                input("self", "float32", &[4, 8], 1.0),
                output(0, "float32", &[4, 8], x),
            ];
            r
        })
        .collect();
    let dir = root.join(if b_side { "b" } else { "a" });
    write_records(&dir, &recs);
    dir
}

fn page_of(root: &Path) -> (PathBuf, PathBuf, String) {
    let (a, b) = (write_side(root, false), write_side(root, true));
    let page = root.join("page.html");
    let r = run_timeout(
        &[
            "compare",
            path_str(&a),
            path_str(&b),
            "--html",
            path_str(&page),
        ],
        60,
    );
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    (a, b, std::fs::read_to_string(&page).unwrap())
}

/// A module node as the page has it.
#[derive(Debug)]
struct Node {
    parent: Option<String>,
    worst: f64,
    open: bool,
}

/// The `<details class="mod…">` elements by path, with the path of the
/// element they are nested in.
fn tree_nodes(page: &str) -> BTreeMap<String, Node> {
    let mut nodes = BTreeMap::new();
    for (tag, parent) in details_tags(page) {
        let Some(p) = attr(tag, "data-path") else {
            continue;
        };
        let node = Node {
            parent,
            worst: attr(tag, "data-worst").unwrap().parse().unwrap(),
            open: tag.contains(" open"),
        };
        assert!(nodes.insert(p.to_string(), node).is_none(), "{p} twice");
    }
    nodes
}

/// What the tree should hold: per module path and its ancestors, the
/// largest error over allowance the comparison finds for its calls.
fn expected_worst(a: &Path, b: &Path) -> BTreeMap<String, f64> {
    let c = compare_dirs(a, b);
    let mut worst: BTreeMap<String, f64> = BTreeMap::new();
    for (k, p) in c.alignment.pairs.iter().enumerate() {
        let excess = c.detail(k).excess;
        let path = c.a.module_of(p.a).unwrap_or("(no module)").to_string();
        let mut prefixes = vec![path.clone()];
        if path != "(no module)" {
            let mut up = path.as_str();
            while let Some((head, _)) = up.rsplit_once('.') {
                prefixes.push(head.to_string());
                up = head;
            }
        }
        for m in prefixes {
            let w = worst.entry(m).or_insert(0.0);
            *w = w.max(excess);
        }
    }
    worst
}

#[test]
fn module_tree_nests_paths_with_the_worst_error_of_each() {
    let t = tmp();
    let (a, b, page) = page_of(t.path());
    let nodes = tree_nodes(&page);
    let expected = expected_worst(&a, &b);
    assert_eq!(
        nodes.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (path, n) in &nodes {
        let parent = path
            .rsplit_once('.')
            .filter(|_| path != "(no module)")
            .map(|(up, _)| up.to_string());
        assert_eq!(n.parent, parent, "{path}");
        assert_eq!(n.worst, expected[path], "{path}");
    }
    // The fault is beyond its allowance, and so every module above it; the
    // other modules are within theirs.
    for p in ["blocks", "blocks.0", "blocks.0.mlp", "blocks.0.mlp.act"] {
        assert!(nodes[p].worst > 1.0, "{p}: {nodes:?}");
        assert!(nodes[p].open, "{p} is on the path to the fault");
    }
    for p in ["blocks.1", "blocks.0.attn", "blocks.0.mlp.fc1"] {
        assert!(nodes[p].worst <= 1.0, "{p}: {nodes:?}");
        assert!(!nodes[p].open, "{p} is off the path to the fault");
    }
    assert!(
        page.contains("&#9650; aten::silu"),
        "the introduced call is listed"
    );
    // Each module filters the plot, with no script.
    assert!(page.contains("<a href=\"#m1\">blocks</a>"));
    assert!(page.contains("body:has(#m1:target) .pt:not(.m1){display:none}"));
    assert!(page.contains("class=\"flt\" id=\"m1\""));
    assert!(!page.contains("<script"));
}

#[test]
fn a_call_both_first_introduced_and_first_divergence_is_shown_once() {
    let t = tmp();
    let (_, _, page) = page_of(t.path());
    let block = "<p class=\"introduced\"><b>aten::silu</b> &mdash; introduced</p>";
    assert_eq!(page.matches(block).count(), 1, "{page}");
    assert!(page.contains("<h2>First divergence</h2><p class=\"same\">aten::silu (seq A 2, seq B 2): the same call as under &ldquo;First introduced divergence&rdquo; above.</p>"));
}
