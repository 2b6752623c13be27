//! The model's module tree as the HTML pages show it: one `<details>` per
//! module path, nested by path, each with what its calls and its
//! descendants' calls showed (`compare`: errors over their allowance;
//! `summary`: op calls and where NaN or Inf came out). Pure CSS: it opens
//! and closes with no script.

use std::collections::HashMap;
use std::fmt::Write;

use super::page::esc;

/// The node of the calls that ran outside any module.
pub const NO_MODULE: &str = "(no module)";

/// A module of the model, with the page's numbers of it (`data`).
pub struct ModNode<T> {
    /// The last part of its path (`fc1`); empty for the root.
    pub name: String,
    /// `blocks.0.mlp.fc1`, or [`NO_MODULE`].
    pub path: String,
    pub parent: Option<u32>,
    pub children: Vec<u32>,
    pub data: T,
}

/// Node 0 is the root above the top-level modules and [`NO_MODULE`].
pub struct ModTree<T> {
    pub nodes: Vec<ModNode<T>>,
    by_path: HashMap<String, u32>,
    /// Some call ran in a module (the dump has module paths).
    pub any_module: bool,
}

impl<T: Default> ModTree<T> {
    pub fn new() -> Self {
        ModTree {
            nodes: vec![ModNode {
                name: String::new(),
                path: String::new(),
                parent: None,
                children: Vec::new(),
                data: T::default(),
            }],
            by_path: HashMap::new(),
            any_module: false,
        }
    }

    /// The node of a module path, made with its missing ancestors.
    pub fn node_of(&mut self, path: &str) -> u32 {
        if let Some(&id) = self.by_path.get(path) {
            return id;
        }
        // `(no module)` holds dots only in no sense: it is one node.
        let split = (path != NO_MODULE).then(|| path.rsplit_once('.')).flatten();
        self.any_module |= path != NO_MODULE;
        let (parent, name) = match split {
            Some((up, name)) => (self.node_of(up), name),
            None => (0, path),
        };
        let id = self.nodes.len() as u32;
        self.nodes.push(ModNode {
            name: name.to_string(),
            path: path.to_string(),
            parent: Some(parent),
            children: Vec::new(),
            data: T::default(),
        });
        self.nodes[parent as usize].children.push(id);
        self.by_path.insert(path.to_string(), id);
        id
    }
}

impl<T> ModTree<T> {
    /// The node of a module path, if some call ran in it.
    pub fn find(&self, path: &str) -> Option<u32> {
        self.by_path.get(path).copied()
    }

    /// `leaf` and its ancestors, the root last.
    pub fn up_from(&self, leaf: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(leaf), |&id| self.nodes[id as usize].parent)
    }

    /// The module and its ancestors (not the root) as classes, `m3 m1`.
    pub fn classes_of(&self, leaf: u32) -> String {
        let ids: Vec<String> = self
            .up_from(leaf)
            .filter(|&id| id != 0)
            .map(|id| format!("m{id}"))
            .collect();
        ids.join(" ")
    }

    /// The nodes from the root to `leaf`: open by default.
    pub fn path_to(&self, leaf: Option<u32>) -> Vec<u32> {
        leaf.map_or(Vec::new(), |l| self.up_from(l).collect())
    }

    /// Top-level modules in call order, [`NO_MODULE`] last.
    pub fn roots(&self) -> Vec<u32> {
        let mut r = self.nodes[0].children.clone();
        r.sort_by_key(|&id| self.nodes[id as usize].path == NO_MODULE);
        r
    }
}

/// What a page shows of each node.
pub trait NodeView<T> {
    /// The name links to `#m<id>` (the compare page's plot filter).
    const LINKED: bool;
    /// More attributes of the node's element: ` data-worst="2.5"`.
    fn attrs(&self, n: &ModNode<T>) -> String;
    /// After the name, on the node's line.
    fn line(&self, out: &mut String, n: &ModNode<T>);
    /// Below its line, above its children: the calls of its own to name.
    fn own(&self, out: &mut String, n: &ModNode<T>);
}

/// The tree, the nodes in `open` open.
pub fn write_tree<T, V: NodeView<T>>(out: &mut String, tree: &ModTree<T>, open: &[u32], view: &V) {
    out.push_str("<div class=\"tree\">");
    for id in tree.roots() {
        write_node(out, tree, id, open, view);
    }
    out.push_str("</div>");
}

fn write_node<T, V: NodeView<T>>(
    out: &mut String,
    tree: &ModTree<T>,
    id: u32,
    open: &[u32],
    view: &V,
) {
    let n = &tree.nodes[id as usize];
    let _ = write!(
        out,
        "<details class=\"mod{}\" data-path=\"{}\"{}{}><summary>",
        if n.children.is_empty() { " leaf" } else { "" },
        esc(&n.path),
        view.attrs(n),
        if open.contains(&id) { " open" } else { "" },
    );
    if V::LINKED {
        let _ = write!(out, "<a href=\"#m{id}\">{}</a> ", esc(&n.name));
    } else {
        let _ = write!(out, "<b>{}</b> ", esc(&n.name));
    }
    view.line(out, n);
    out.push_str("</summary>");
    view.own(out, n);
    for &c in &n.children {
        write_node(out, tree, c, open, view);
    }
    out.push_str("</details>");
}
