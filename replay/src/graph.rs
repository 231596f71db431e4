//! `annal graph`: a session's revision graph as Graphviz DOT, SVG, or text.
//!
//! Nodes are the revisions the session has held; an edge is one head transition (a
//! turn, a rewrite or a restore), so a restore draws an edge back to an older node.
//! Sessions forked from this one, and the session it was forked from, are boxes joined
//! by dashed edges.

use crate::{CliError, Result};
use annal::{NodeOrigin, RevisionGraph, RevisionId, SessionId};
use std::fmt::Write as _;

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Graphviz DOT, written by this program.
    Dot,
    /// SVG, laid out from the DOT by the `layout-rs` crate.
    Svg,
    /// A text timeline for terminals.
    Text,
}

fn node_id(r: &RevisionId) -> String {
    format!("r_{}", &r.to_hex()[..16])
}

fn session_node(s: &SessionId) -> String {
    format!("s_{}", crate::hex(&s.0))
}

/// Escapes a string for a double-quoted DOT label.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' | '\r' => out.push_str("\\n"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    s.push('…');
    s
}

fn origin_label(o: &NodeOrigin) -> String {
    match o {
        NodeOrigin::Created => "created".into(),
        NodeOrigin::Turn { turn_id } => format!("turn {}", shorten(turn_id, 24)),
        NodeOrigin::Rewrite { kind, note, .. } if note.is_empty() => kind.clone(),
        NodeOrigin::Rewrite { kind, note, .. } => format!("{kind}: {}", shorten(note, 32)),
    }
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// The graph as Graphviz DOT: one statement per line.
pub fn dot(g: &RevisionGraph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"session {}\" {{", g.session);
    let _ = writeln!(out, "  rankdir=TB;");
    let _ = writeln!(out, "  node [shape=ellipse, fontname=\"monospace\", fontsize=10];");
    let _ = writeln!(out, "  edge [fontname=\"monospace\", fontsize=9];");
    for n in &g.nodes {
        let head = if n.revision == g.head { ", penwidth=2, style=filled, fillcolor=\"#e8f0ff\"" } else { "" };
        let label = format!(
            "#{} {}\n{}\n{}",
            n.ordinal,
            n.revision.short(),
            esc(&origin_label(&n.origin)),
            plural(n.message_count, "msg")
        );
        let _ = writeln!(out, "  \"{}\" [label=\"{}\"{head}];", node_id(&n.revision), esc(&label));
    }
    for e in &g.edges {
        let Some(from) = e.from else { continue };
        let label = match &e.origin {
            NodeOrigin::Turn { turn_id } => shorten(turn_id, 24),
            NodeOrigin::Rewrite { kind, .. } => kind.clone(),
            NodeOrigin::Created => "created".into(),
        };
        let style = match &e.origin {
            NodeOrigin::Rewrite { kind, .. } if kind == "restore" => ", color=\"#b05000\", constraint=false",
            NodeOrigin::Rewrite { .. } => ", color=\"#0050b0\"",
            _ => "",
        };
        let _ = writeln!(
            out,
            "  \"{}\" -> \"{}\" [label=\"{} (seq {})\"{style}];",
            node_id(&from),
            node_id(&e.to),
            esc(&label),
            e.seq
        );
    }
    if let Some(f) = &g.forked_from {
        let _ = writeln!(
            out,
            "  \"{}\" [shape=box, style=dashed, label=\"forked from\\nsession {}\"];",
            session_node(&f.session),
            f.session
        );
        if let Some(first) = g.nodes.first() {
            let _ = writeln!(
                out,
                "  \"{}\" -> \"{}\" [style=dashed, label=\"fork at {}\"];",
                session_node(&f.session),
                node_id(&first.revision),
                plural(f.message_count, "msg")
            );
        }
    }
    for f in &g.forks {
        let _ = writeln!(
            out,
            "  \"{}\" [shape=box, style=dashed, label=\"fork\\nsession {}\"];",
            session_node(&f.child),
            f.child
        );
        let _ = writeln!(
            out,
            "  \"{}\" -> \"{}\" [style=dashed, label=\"fork at {} (seq {})\"];",
            node_id(&f.revision),
            session_node(&f.child),
            plural(f.message_count, "msg"),
            f.seq
        );
    }
    out.push_str("}\n");
    out
}

/// Node and edge counts [`dot`] writes for `g`: revisions plus fork boxes, and
/// transitions plus fork edges.
pub fn dot_counts(g: &RevisionGraph) -> (usize, usize) {
    let origin = usize::from(g.forked_from.is_some());
    let origin_edge = usize::from(g.forked_from.is_some() && !g.nodes.is_empty());
    let transitions = g.edges.iter().filter(|e| e.from.is_some()).count();
    (g.nodes.len() + g.forks.len() + origin, transitions + g.forks.len() + origin_edge)
}

/// The graph as SVG: [`dot`]'s output parsed and laid out by the `layout-rs` crate.
/// (With Graphviz installed, `annal graph --format dot | dot -Tsvg` gives its layout.)
pub fn svg(g: &RevisionGraph) -> Result<String> {
    let source = dot(g);
    let mut parser = layout::gv::DotParser::new(&source);
    let ast = parser.process().map_err(|e| CliError::finding(format!("the DOT does not parse for layout: {e}")))?;
    let mut builder = layout::gv::GraphBuilder::new();
    builder.visit_graph(&ast);
    let mut visual = builder.get();
    let mut writer = layout::backends::svg::SVGWriter::new();
    visual.do_it(false, false, false, &mut writer);
    Ok(writer.finalize())
}

/// The graph as a text timeline: one line per head transition and per fork, in commit
/// order. `●` marks a new revision, `↺` a return to one held before, `⑂` a fork.
pub fn text(g: &RevisionGraph) -> String {
    let mut out = String::new();
    let transitions = g.edges.iter().filter(|e| e.from.is_some()).count();
    let _ = writeln!(
        out,
        "revision graph of session {} — {}, {}, head {}",
        g.session,
        plural(g.nodes.len() as u64, "revision"),
        plural(transitions as u64, "transition"),
        g.head.short()
    );
    if let Some(f) = &g.forked_from {
        let _ = writeln!(
            out,
            "  forked from session {} at {} ({})",
            f.session,
            f.revision.short(),
            plural(f.message_count, "msg")
        );
    }
    let _ = writeln!(out, "  {:>5}    {:<13} {:>5}  what", "seq", "revision", "msgs");
    let nodes: std::collections::HashMap<RevisionId, &annal::RevisionNode> =
        g.nodes.iter().map(|n| (n.revision, n)).collect();
    let mut lines: Vec<(u64, String)> = Vec::new();
    for e in &g.edges {
        let node = nodes.get(&e.to);
        let fresh = node.is_some_and(|n| n.seq == e.seq);
        let mark = if fresh { "●" } else { "↺" };
        let msgs = node.map_or(0, |n| n.message_count);
        let mut what = match &e.origin {
            NodeOrigin::Created => "created".to_string(),
            NodeOrigin::Turn { turn_id } => format!("turn {turn_id}"),
            NodeOrigin::Rewrite { kind, note, actor } => format!("{kind} by {actor}: {}", shorten(note, 48)),
        };
        if let (false, Some(n)) = (fresh, node) {
            let _ = write!(what, "  (back to #{})", n.ordinal);
        }
        lines.push((e.seq, format!("  {:>5}  {mark} {:<13} {:>5}  {what}", e.seq, e.to.short(), msgs)));
    }
    for f in &g.forks {
        lines.push((
            f.seq,
            format!("  {:>5}  ⑂ fork → session {} with the first {}", f.seq, f.child, plural(f.message_count, "msg")),
        ));
    }
    lines.sort_by_key(|(seq, _)| *seq);
    for (_, line) in lines {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Renders `g` in `format`.
pub fn render(g: &RevisionGraph, format: Format) -> Result<String> {
    match format {
        Format::Dot => Ok(dot(g)),
        Format::Svg => svg(g),
        Format::Text => Ok(text(g)),
    }
}
