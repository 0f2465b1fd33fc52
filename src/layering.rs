//! The library's modules form layers: no module reaches, through its imports, back to itself
//! (issue 24). This test reads every production file of `src/`, takes the paths it names
//! (`crate::…`, `super::…`, `self::…`, and the child modules a file declares), maps each to the
//! module file that defines it, and fails on every cycle of that graph, naming its files and the
//! imports that tie them. Test code (`#[cfg(test)]` modules and items) is left out: tests may reach
//! anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module by its path from the crate root (`["scaledown", "act"]`).
type Module = Vec<String>;

/// Every production module of `src` (the library crate): module path -> source file.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    collect(src, &mut Vec::new(), &mut found, true);
    for (module, file) in &found {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for child in test_children(&text) {
            let mut m = module.clone();
            m.push(child);
            test_only.insert(m);
        }
    }
    found.retain(|m, _| !test_only.iter().any(|t| m.starts_with(t)));
    found
}

fn collect(dir: &Path, prefix: &mut Module, found: &mut BTreeMap<Module, PathBuf>, root: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if root && name == "bin" {
                continue; // other crates
            }
            prefix.push(name);
            collect(&path, prefix, found, false);
            prefix.pop();
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut module = prefix.clone();
            match stem {
                "lib" | "main" if root => {
                    if stem == "main" {
                        continue; // the binary crate
                    }
                }
                "mod" => {}
                _ => module.push(stem.to_string()),
            }
            found.insert(module, path);
        }
    }
}

/// The child modules a file declares under `#[cfg(test)]`.
fn test_children(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| w[1].strip_prefix("mod ").or(w[1].strip_prefix("pub mod ")))
        .map(|rest| rest.trim_end_matches([';', '{', ' ']).to_string())
        .collect()
}

/// `text` without comments and without the items under `#[cfg(test)]`.
fn production(text: &str) -> String {
    let code: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while i < code.len() {
        if code[i].trim() != "#[cfg(test)]" {
            out.push_str(code[i]);
            out.push('\n');
            i += 1;
            continue;
        }
        // Skip the attribute and the item after it: to its `;` or its matching `}`.
        let mut depth = 0i32;
        i += 1;
        while i < code.len() {
            depth += code[i].matches('{').count() as i32 - code[i].matches('}').count() as i32;
            let ends = depth <= 0 && (code[i].contains('}') || code[i].trim_end().ends_with(';'));
            i += 1;
            if ends {
                break;
            }
        }
    }
    out
}

/// The paths named in `code`: those starting at `crate`, `super` or `self`, with use-trees
/// (`a::{b, c::d}`) expanded, and those starting at a child module in `children`.
fn named_paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        let after_colons = i >= 2 && chars[i - 1] == ':' && chars[i - 2] == ':';
        if starts_word && !after_colons {
            let word = ident(&chars, i);
            let anchored = matches!(word.as_str(), "crate" | "super" | "self");
            if (anchored || children.contains(&word)) && lookahead(&chars, i + word.len(), "::") {
                let mut out = Vec::new();
                let end = use_tree(&chars, i, Vec::new(), &mut out);
                paths.extend(out);
                i = end.max(i + 1);
                continue;
            }
        }
        i += 1;
    }
    paths
}

fn ident(chars: &[char], at: usize) -> String {
    chars[at..]
        .iter()
        .take_while(|c| c.is_alphanumeric() || **c == '_')
        .collect()
}

fn lookahead(chars: &[char], at: usize, s: &str) -> bool {
    s.chars()
        .enumerate()
        .all(|(k, c)| chars.get(at + k) == Some(&c))
}

/// Parses a use-tree at `at` under `prefix`, pushing every full path; returns where it ended.
fn use_tree(
    chars: &[char],
    mut at: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        while chars.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
        }
        if chars.get(at) == Some(&'{') {
            at += 1;
            loop {
                at = use_tree(chars, at, prefix.clone(), out);
                while chars
                    .get(at)
                    .is_some_and(|c| c.is_whitespace() || *c == ',')
                {
                    at += 1;
                }
                match chars.get(at) {
                    Some('}') => return at + 1,
                    None => return at,
                    _ => {}
                }
            }
        }
        let word = ident(chars, at);
        if word.is_empty() {
            out.push(prefix);
            return at;
        }
        prefix.push(word.clone());
        at += word.len();
        if lookahead(chars, at, "::") {
            at += 2;
        } else {
            out.push(prefix);
            return at;
        }
    }
}

/// The module a path names from `from`: the longest prefix that is a module.
fn resolve(from: &Module, path: &[String], known: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut base: Module = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("self") | Some("super") => {
            // In `a/b.rs` (module a::b) `self` is a::b and `super` is a; the same in `a/b/mod.rs`.
            base = from.clone();
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "self" => {}
                    "super" => {
                        base.pop();
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => base = from.clone(), // a child module of `from`
    }
    let mut best = None;
    let mut candidate = base.clone();
    if known.contains_key(&candidate) {
        best = Some(candidate.clone());
    }
    for seg in rest {
        candidate.push(seg.clone());
        if known.contains_key(&candidate) {
            best = Some(candidate.clone());
        } else {
            break;
        }
    }
    best
}

/// The import graph: module -> module -> the names that tie them.
type Graph = BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>>;

fn graph(known: &BTreeMap<Module, PathBuf>) -> Graph {
    let mut g: Graph = BTreeMap::new();
    for (module, file) in known {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let code = production(&text);
        let children: BTreeSet<String> = known
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .filter_map(|m| m.last().cloned())
            .collect();
        for path in named_paths(&code, &children) {
            let Some(to) = resolve(module, &path, known) else {
                continue;
            };
            // The crate root only declares the modules: a path that stops there names a macro.
            if to != *module && !to.is_empty() {
                let name = path.last().cloned().unwrap_or_default();
                g.entry(module.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(name);
            }
        }
    }
    g
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(g: &Graph) -> Vec<Vec<Module>> {
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.g.get(v).into_iter().flat_map(|e| e.keys()) {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn show(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Every cycle, with the imports inside it.
fn describe(g: &Graph, scc: &[Module]) -> String {
    let mut lines = vec![format!(
        "{} modules: {}",
        scc.len(),
        scc.iter().map(show).collect::<Vec<_>>().join(", ")
    )];
    for from in scc {
        for (to, names) in g
            .get(from)
            .into_iter()
            .flatten()
            .filter(|(to, _)| scc.contains(to))
        {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            lines.push(format!(
                "  {} -> {}: {}",
                show(from),
                show(to),
                names.join(", ")
            ));
        }
    }
    lines.join("\n")
}

#[test]
fn no_module_imports_its_way_back_to_itself() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    assert!(known.len() > 30, "read {} modules", known.len());
    let g = graph(&known);
    let edges: usize = g.values().map(BTreeMap::len).sum();
    let found = cycles(&g);
    println!(
        "layering: {} production modules, {edges} imports between them, {} cycles",
        known.len(),
        found.len()
    );
    let text: Vec<String> = found.iter().map(|c| describe(&g, c)).collect();
    assert!(
        found.is_empty(),
        "import cycles in src/:\n{}",
        text.join("\n")
    );
}

/// The check finds what it is for: a planted cycle through a use-tree, `super` and a child module,
/// and nothing where the arrows run one way; test items are not read.
#[test]
fn the_check_sees_use_trees_super_and_children() {
    let known: BTreeMap<Module, PathBuf> = [
        vec![],
        vec!["a".into()],
        vec!["a".into(), "b".into()],
        vec!["c".into()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let children: BTreeSet<String> = ["b".to_string()].into();
    let code = production(
        "use crate::{c::{X, Y}, a::b};\nfn f() { b::g(); super::h(); }\n#[cfg(test)]\nmod tests {\n    use crate::c::Z;\n}\n",
    );
    let paths = named_paths(&code, &children);
    let resolved: Vec<String> = paths
        .iter()
        .filter_map(|p| resolve(&vec!["a".into()], p, &known))
        .map(|m| show(&m))
        .collect();
    assert_eq!(resolved, ["c", "c", "a::b", "a::b", "crate"]);
    assert!(!code.contains("c::Z"), "test items are left out");

    let mut g: Graph = BTreeMap::new();
    let edge = |g: &mut Graph, a: &[&str], b: &[&str]| {
        let m = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Module>();
        g.entry(m(a))
            .or_default()
            .entry(m(b))
            .or_default()
            .insert("x".into());
    };
    edge(&mut g, &["a"], &["c"]);
    edge(&mut g, &["a", "b"], &["c"]);
    assert!(cycles(&g).is_empty());
    edge(&mut g, &["c"], &["a", "b"]);
    assert_eq!(cycles(&g).len(), 1);
}
