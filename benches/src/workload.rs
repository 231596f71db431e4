//! Seeded, deterministic agent-session workloads.
//!
//! A session starts with the shared system prompt. Each turn is a user message, zero
//! or more tool round trips (an assistant message carrying the call's JSON arguments,
//! then a tool message carrying the result), and a final assistant message. Around the
//! turns, the generator stages context that the next turn applies, compacts the
//! transcript every K turns (messages `1..len-2` become one summary), sometimes undoes
//! a compaction right away (a restore), and sometimes forks the session.
//!
//! Sizes come from [`Shape`]; every draw comes from a [`SplitMix64`] seeded by the
//! workload seed and the session's index, so the same seed gives byte-identical
//! sessions whatever the store or the number of committers.

use crate::rng::{SizeDist, SplitMix64};

/// Who speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// System prompt or summary.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// Lower-case name, as the JSON stores write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses [`Role::as_str`].
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }
}

/// One message. Bodies are printable ASCII, so JSON stores need no escaping tricks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    /// Who speaks.
    pub role: Role,
    /// Media type.
    pub content_type: &'static str,
    /// The host's serialized message.
    pub body: Vec<u8>,
}

/// A turn: messages appended in one durable commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// Idempotency key.
    pub id: String,
    /// User, tool round trips, final assistant.
    pub messages: Vec<Msg>,
    /// Input and output tokens.
    pub usage: (u64, u64),
    /// A context key staged before and applied by this turn.
    pub apply_context: Option<String>,
}

/// One durable operation on a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Commit a turn.
    Turn(Turn),
    /// Stage context for the next turn.
    Context {
        /// Key.
        key: String,
        /// Content bytes.
        content: Vec<u8>,
    },
    /// Replace messages `start..end` with `summary`.
    Compact {
        /// First replaced position.
        start: u64,
        /// One past the last replaced position.
        end: u64,
        /// The summary message.
        summary: Msg,
    },
    /// Undo the compaction that immediately precedes this op (restore the revision the
    /// session had before it).
    Restore,
    /// Fork a new session holding the first `index` messages.
    Fork {
        /// Messages kept.
        index: u64,
    },
}

impl Op {
    /// The content the host hands in with this op: a turn's message bodies, a context
    /// append's content, a compaction's summary; nothing for a restore or a fork.
    pub fn content(&self) -> Vec<&[u8]> {
        match self {
            Op::Turn(t) => t.messages.iter().map(|m| m.body.as_slice()).collect(),
            Op::Context { content, .. } => vec![content.as_slice()],
            Op::Compact { summary, .. } => vec![summary.body.as_slice()],
            Op::Restore | Op::Fork { .. } => Vec::new(),
        }
    }

    /// Bytes of content the host hands in with this op.
    pub fn logical_bytes(&self) -> u64 {
        self.content().iter().map(|c| c.len() as u64).sum()
    }

    /// Short name for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Turn(_) => "turn",
            Op::Context { .. } => "context",
            Op::Compact { .. } => "compact",
            Op::Restore => "restore",
            Op::Fork { .. } => "fork",
        }
    }
}

/// Sizes and frequencies of a workload.
#[derive(Clone, Debug)]
pub struct Shape {
    /// The shared system prompt, drawn once per workload.
    pub system_prompt: SizeDist,
    /// User messages.
    pub user: SizeDist,
    /// Assistant messages.
    pub assistant: SizeDist,
    /// Tool-call arguments.
    pub tool_args: SizeDist,
    /// Tool results.
    pub tool_result: SizeDist,
    /// Tool round trips per turn.
    pub tool_calls: SizeDist,
    /// Compaction summaries.
    pub summary: SizeDist,
    /// Staged context.
    pub context: SizeDist,
    /// Compact every this many turns (0: never).
    pub compact_every_turns: u64,
    /// Probability that a compaction is undone right away.
    pub restore_probability: f64,
    /// Probability of a fork after a turn.
    pub fork_probability: f64,
    /// Probability of staging context after a turn.
    pub context_probability: f64,
}

impl Shape {
    /// The default agent-session shape.
    pub fn agent() -> Shape {
        Shape {
            system_prompt: SizeDist::Uniform { low: 8 << 10, high: 30 << 10 },
            user: SizeDist::LogUniform { low: 100, high: 4 << 10 },
            assistant: SizeDist::LogUniform { low: 200, high: 16 << 10 },
            tool_args: SizeDist::LogUniform { low: 100, high: 2 << 10 },
            tool_result: SizeDist::BoundedPareto { low: 200, high: 64 << 10, alpha: 0.8 },
            tool_calls: SizeDist::Uniform { low: 0, high: 3 },
            summary: SizeDist::LogUniform { low: 1 << 10, high: 4 << 10 },
            context: SizeDist::LogUniform { low: 200, high: 4 << 10 },
            compact_every_turns: 20,
            restore_probability: 0.25,
            fork_probability: 0.01,
            context_probability: 0.1,
        }
    }

    /// Appends only: turns and context, no compaction, fork or restore.
    pub fn append_only() -> Shape {
        Shape { compact_every_turns: 0, restore_probability: 0.0, fork_probability: 0.0, ..Shape::agent() }
    }

    /// Compaction-heavy: a compaction every 4 turns.
    pub fn compaction_heavy() -> Shape {
        Shape { compact_every_turns: 4, ..Shape::agent() }
    }

    /// One line per distribution, for the report.
    pub fn describe(&self) -> Vec<(String, String)> {
        vec![
            ("system prompt (shared)".into(), self.system_prompt.describe()),
            ("user message".into(), self.user.describe()),
            ("assistant message".into(), self.assistant.describe()),
            ("tool round trips per turn".into(), self.tool_calls.describe().replace(" B", "")),
            ("tool arguments".into(), self.tool_args.describe()),
            ("tool result".into(), self.tool_result.describe()),
            ("compaction summary".into(), self.summary.describe()),
            ("staged context".into(), self.context.describe()),
            (
                "compaction".into(),
                if self.compact_every_turns == 0 {
                    "never".into()
                } else {
                    format!(
                        "every {} turns; undone right away with p={}",
                        self.compact_every_turns, self.restore_probability
                    )
                },
            ),
            ("fork after a turn".into(), format!("p={}", self.fork_probability)),
            ("context staged after a turn".into(), format!("p={}", self.context_probability)),
        ]
    }
}

const WORDS: &[&str] = &[
    "the",
    "agent",
    "reads",
    "file",
    "src/main.rs",
    "and",
    "runs",
    "cargo",
    "test",
    "--release",
    "error",
    "fn",
    "let",
    "value",
    "session",
    "turn",
    "result",
    "ok",
    "tool",
    "bash",
    "grep",
    "returns",
    "context",
    "model",
    "commit",
    "index",
    "{",
    "}",
    "=>",
    "match",
    "line",
    "42",
    "patch",
    "diff",
    "write",
    "query",
    "user",
];

/// Printable text of exactly `len` bytes: a unique tag, then words drawn from `rng`.
pub fn text(rng: &mut SplitMix64, tag: &str, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    out.extend_from_slice(tag.as_bytes());
    while out.len() < len {
        out.push(b' ');
        let w = WORDS[(rng.next_u64() % WORDS.len() as u64) as usize];
        out.extend_from_slice(w.as_bytes());
    }
    out.truncate(len);
    out
}

/// The shared system prompt of a workload.
pub fn system_prompt(shape: &Shape, seed: u64) -> Msg {
    let mut rng = SplitMix64::derive(seed, u64::MAX);
    let len = shape.system_prompt.sample(&mut rng) as usize;
    Msg { role: Role::System, content_type: "text/plain", body: text(&mut rng, "system:", len) }
}

/// The ops of session `index` of a workload, about `ops` of them (a compaction may be
/// followed by its restore, so the plan can end one op past `ops`).
pub fn session_plan(shape: &Shape, seed: u64, index: u64, ops: usize) -> Vec<Op> {
    let mut rng = SplitMix64::derive(seed, index);
    let mut plan = Vec::with_capacity(ops + 1);
    let mut len = 1u64; // the system prompt
    let mut turns = 0u64;
    let mut pending: Option<String> = None;
    while plan.len() < ops {
        let tag = format!("s{index}.o{}:", plan.len());
        let turn = make_turn(shape, &mut rng, &tag, turns, pending.take());
        len += turn.messages.len() as u64;
        turns += 1;
        plan.push(Op::Turn(turn));
        if shape.compact_every_turns > 0 && turns.is_multiple_of(shape.compact_every_turns) && len > 4 {
            let size = shape.summary.sample(&mut rng) as usize;
            let summary = Msg {
                role: Role::System,
                content_type: "text/plain",
                body: text(&mut rng, &format!("{tag}summary:"), size),
            };
            let (start, end) = (1, len - 2);
            plan.push(Op::Compact { start, end, summary });
            if rng.chance(shape.restore_probability) {
                plan.push(Op::Restore);
            } else {
                len = len - (end - start) + 1;
            }
        } else if rng.chance(shape.context_probability) {
            let key = format!("ctx-{}", plan.len());
            let size = shape.context.sample(&mut rng) as usize;
            let content = text(&mut rng, &format!("{tag}context:"), size);
            plan.push(Op::Context { key: key.clone(), content });
            pending = Some(key);
        } else if rng.chance(shape.fork_probability) {
            plan.push(Op::Fork { index: rng.range(1, len) });
        }
    }
    plan
}

fn make_turn(shape: &Shape, rng: &mut SplitMix64, tag: &str, turn: u64, apply: Option<String>) -> Turn {
    let mut messages = Vec::new();
    let user = shape.user.sample(rng) as usize;
    messages.push(Msg { role: Role::User, content_type: "text/plain", body: text(rng, &format!("{tag}user:"), user) });
    for call in 0..shape.tool_calls.sample(rng) {
        let args = shape.tool_args.sample(rng) as usize;
        let mut body = format!("{{\"tool\":\"bash\",\"call\":\"{tag}{call}\",\"args\":\"").into_bytes();
        let filler = args.saturating_sub(body.len() + 2).max(1);
        body.extend(text(rng, "", filler));
        body.extend_from_slice(b"\"}");
        messages.push(Msg { role: Role::Assistant, content_type: "application/json", body });
        let result = shape.tool_result.sample(rng) as usize;
        let body = text(rng, &format!("{tag}result{call}:"), result);
        messages.push(Msg { role: Role::Tool, content_type: "text/plain", body });
    }
    let assistant = shape.assistant.sample(rng) as usize;
    let body = text(rng, &format!("{tag}assistant:"), assistant);
    messages.push(Msg { role: Role::Assistant, content_type: "text/plain", body });
    let input = messages.iter().map(|m| m.body.len() as u64).sum::<u64>() / 4;
    Turn { id: format!("turn-{turn}"), messages, usage: (input, assistant as u64 / 4), apply_context: apply }
}

/// A tiny turn for bulk loads: one user message of `len` bytes.
pub fn tiny_turn(rng: &mut SplitMix64, session: u64, turn: u64, len: usize) -> Turn {
    let tag = format!("b{session}.{turn}:");
    let body = text(rng, &tag, len);
    Turn {
        id: format!("turn-{turn}"),
        messages: vec![Msg { role: Role::User, content_type: "text/plain", body }],
        usage: (len as u64 / 4, 0),
        apply_context: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_deterministic() {
        let shape = Shape::agent();
        assert_eq!(session_plan(&shape, 9, 3, 200), session_plan(&shape, 9, 3, 200));
        assert_ne!(session_plan(&shape, 9, 3, 50), session_plan(&shape, 9, 4, 50));
        assert_eq!(system_prompt(&shape, 9), system_prompt(&shape, 9));
    }

    #[test]
    fn plans_have_every_op_kind() {
        let plan = session_plan(&Shape::compaction_heavy(), 1, 0, 2000);
        for kind in ["turn", "context", "compact", "restore", "fork"] {
            assert!(plan.iter().any(|op| op.kind() == kind), "no {kind}");
        }
        let sizes: Vec<usize> = plan
            .iter()
            .filter_map(|op| match op {
                Op::Turn(t) => Some(t.messages[0].body.len()),
                _ => None,
            })
            .collect();
        assert!(sizes.iter().all(|s| (100..=4096).contains(s)));
    }

    #[test]
    fn restore_follows_compaction() {
        let plan = session_plan(&Shape::compaction_heavy(), 2, 0, 1000);
        for (i, op) in plan.iter().enumerate() {
            if *op == Op::Restore {
                assert!(matches!(plan[i - 1], Op::Compact { .. }));
            }
        }
    }
}
