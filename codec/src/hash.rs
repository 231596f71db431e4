//! The hash functions of SPEC §3: content ids, the transcript revision chain, the log
//! record chain (plain or keyed), and the turn commit hash.

use crate::event::Usage;
use crate::ids::{ChainHash, CommitHash, ContentId, RevisionId};
#[cfg(test)]
use serde::Serialize;

/// Domain string that seeds the transcript chain: `c0 = blake3("annal.transcript.v1")`.
pub const TRANSCRIPT_DOMAIN: &[u8] = b"annal.transcript.v1";
/// Domain string that seeds the log chain: `h(0) = blake3("annal.log.v1")` (keyed in keyed mode).
pub const LOG_DOMAIN: &[u8] = b"annal.log.v1";
/// Domain string of the payload digest a format-2 record's chain link covers.
pub const PAYLOAD_DOMAIN: &[u8] = b"annal.payload.v1";
/// Domain string for the turn commit hash.
pub const TURN_DOMAIN: &[u8] = b"annal.turn.v1";
/// Domain string whose keyed hash is stored to recognise the chain key at open.
pub const KEY_CHECK_DOMAIN: &[u8] = b"annal.key-check.v1";

/// The content id of canonical bytes: `blake3(bytes)`.
pub fn content_id(bytes: &[u8]) -> ContentId {
    ContentId(*blake3::hash(bytes).as_bytes())
}

impl RevisionId {
    /// `c0`: the revision of an empty transcript.
    pub fn empty() -> RevisionId {
        RevisionId(*blake3::hash(TRANSCRIPT_DOMAIN).as_bytes())
    }

    /// `c(i) = blake3(c(i-1) || content_id(m(i)))`: the 64 bytes hashed in one call, which
    /// takes none of an incremental hasher's bookkeeping (a fold takes this step for every
    /// message it appends).
    pub fn extend(&self, message: &ContentId) -> RevisionId {
        let mut input = [0u8; 64];
        input[..32].copy_from_slice(&self.0);
        input[32..].copy_from_slice(&message.0);
        RevisionId(*blake3::hash(&input).as_bytes())
    }

    /// The chain over `messages`, starting from `self`.
    pub fn extend_all<'a>(&self, messages: impl IntoIterator<Item = &'a ContentId>) -> RevisionId {
        messages.into_iter().fold(*self, |c, m| c.extend(m))
    }

    /// The revision id of a transcript holding exactly `messages`.
    pub fn of(messages: &[ContentId]) -> RevisionId {
        RevisionId::empty().extend_all(messages)
    }
}

/// The log record chain, `H` being blake3, or blake3's keyed mode when the host supplies
/// a 32-byte key. A record of format 2 links its 52 header bytes and the digest of its
/// payload: `h(seq) = H(h(seq-1) || header || H(PAYLOAD_DOMAIN || payload))` (see
/// [`LogChain::payload_digest`]); an erased record, which stores the digest in place of
/// the payload and the magic `ANNE`, is linked with the magic `ANNL`, so erasing a
/// record keeps its hash. A record of format 1 links every byte before its stored hash:
/// `h(seq) = H(h(seq-1) || record bytes)`. [`crate::chain_link`] picks the rule by the
/// record's magic and format byte.
#[derive(Clone)]
pub struct LogChain {
    key: Option<[u8; 32]>,
}

impl std::fmt::Debug for LogChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogChain").field("keyed", &self.key.is_some()).finish()
    }
}

impl LogChain {
    /// The unkeyed chain.
    pub fn plain() -> LogChain {
        LogChain { key: None }
    }

    /// The keyed chain: nobody without `key` can forge a record.
    pub fn keyed(key: [u8; 32]) -> LogChain {
        LogChain { key: Some(key) }
    }

    /// Whether this chain is keyed.
    pub fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    fn hasher(&self) -> blake3::Hasher {
        match &self.key {
            Some(k) => blake3::Hasher::new_keyed(k),
            None => blake3::Hasher::new(),
        }
    }

    /// `h(0)`, the value before the first record.
    pub fn genesis(&self) -> ChainHash {
        let mut h = self.hasher();
        h.update(LOG_DOMAIN);
        ChainHash(*h.finalize().as_bytes())
    }

    /// `H(h(seq-1) || body)`: `h(seq)` from `h(seq-1)` and the bytes the link covers (a
    /// format-2 record's header and payload digest, or, for format 1, every byte of the
    /// record before its stored hash).
    pub fn next(&self, prev: &ChainHash, record_body: &[u8]) -> ChainHash {
        let mut h = self.hasher();
        h.update(&prev.0);
        h.update(record_body);
        ChainHash(*h.finalize().as_bytes())
    }

    /// The digest of a record's payload that a format-2 chain link covers:
    /// `H(PAYLOAD_DOMAIN || payload)`, keyed when the chain is. It is what an erased
    /// record keeps of its payload; under a key, nobody without the key can test a guess
    /// of the erased bytes against it.
    pub fn payload_digest(&self, payload: &[u8]) -> [u8; 32] {
        let mut h = self.hasher();
        h.update(PAYLOAD_DOMAIN);
        h.update(payload);
        *h.finalize().as_bytes()
    }

    /// A value stored in the file that lets an open recognise a wrong key without
    /// revealing the key. `None` for the plain chain.
    pub fn key_check(&self) -> Option<[u8; 32]> {
        self.key.map(|k| *blake3::keyed_hash(&k, KEY_CHECK_DOMAIN).as_bytes())
    }
}

/// What a turn's commit hash covers, in the order it is encoded.
#[cfg(test)]
#[derive(Serialize)]
struct TurnSemantics<'a> {
    messages: &'a [ContentId],
    usage: &'a [Usage],
    applied_context: &'a [String],
    tool_ops: &'a [String],
}

/// The turn commit hash: blake3 over the canonical encoding of the turn's semantic
/// content. Expected revision, run id and timestamps are excluded, so an exact retry
/// hashes identically.
pub fn turn_commit_hash(
    messages: &[ContentId],
    usage: &[Usage],
    applied_context: &[String],
    tool_ops: &[String],
) -> CommitHash {
    // The canonical encoding of `TurnSemantics`, written by hand where serde is slow. A
    // struct encodes as its fields in order, and a list of ids as a varint count then 32
    // raw bytes an id, so the ids are copied in as they lie, not a byte at a time through
    // serde (`commit_hash_encodes_as_serde` holds the two to the same bytes).
    use bincode::Options;
    let wire = || crate::wire::options(u64::MAX).with_no_limit();
    let mut bytes = Vec::with_capacity(96 + 32 * messages.len());
    // Writing into a Vec cannot fail, and nothing here has a size limit.
    let _ = wire().serialize_into(&mut bytes, &(messages.len() as u64));
    for id in messages {
        bytes.extend_from_slice(&id.0);
    }
    let _ = wire().serialize_into(&mut bytes, &(usage, applied_context, tool_ops));
    let mut h = blake3::Hasher::new();
    h.update(TURN_DOMAIN);
    h.update(&bytes);
    CommitHash(*h.finalize().as_bytes())
}

/// Domain of [`turn_commit_hash_with_state`] when a turn changes host state.
const TURN_STATE_DOMAIN: &[u8] = b"annal.turn.state.v1";

/// The commit hash of a turn that may also set and remove host state entries: the
/// [`turn_commit_hash`] of its other content when `state` is empty (so a turn without
/// state hashes as it always has), else `blake3(domain ‖ that hash ‖ canonical(state))`.
pub fn turn_commit_hash_with_state(
    messages: &[ContentId],
    usage: &[Usage],
    applied_context: &[String],
    tool_ops: &[String],
    state: &crate::event::StateDelta,
) -> CommitHash {
    let base = turn_commit_hash(messages, usage, applied_context, tool_ops);
    if state.is_empty() {
        return base;
    }
    let bytes = crate::wire::to_bytes(state, u64::MAX).unwrap_or_default();
    let mut h = blake3::Hasher::new();
    h.update(TURN_STATE_DOMAIN);
    h.update(&base.0);
    h.update(&bytes);
    CommitHash(*h.finalize().as_bytes())
}

const TURN_INPUTS_DOMAIN: &[u8] = b"annal.turn.inputs.v1";

/// The commit hash of a turn that may also consume queued inputs: the
/// [`turn_commit_hash_with_state`] of its other content when `inputs` is empty (so a
/// turn without inputs hashes as it always has), else
/// `blake3(domain ‖ that hash ‖ canonical(inputs))`.
pub fn turn_commit_hash_with_inputs(
    messages: &[ContentId],
    usage: &[Usage],
    applied_context: &[String],
    tool_ops: &[String],
    state: &crate::event::StateDelta,
    inputs: &[String],
) -> CommitHash {
    let base = turn_commit_hash_with_state(messages, usage, applied_context, tool_ops, state);
    if inputs.is_empty() {
        return base;
    }
    let bytes = crate::wire::to_bytes(&inputs, u64::MAX).unwrap_or_default();
    let mut h = blake3::Hasher::new();
    h.update(TURN_INPUTS_DOMAIN);
    h.update(&base.0);
    h.update(&bytes);
    CommitHash(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The commit hash writes its encoding by hand; it must hash exactly serde's
        /// canonical encoding of the turn's semantics (the count's varint in its long
        /// forms too, past 250 ids).
        #[test]
        fn commit_hash_encodes_as_serde(
            ids in proptest::collection::vec(proptest::array::uniform32(proptest::num::u8::ANY), 0..300),
            usage in proptest::collection::vec(("[a-z]{0,5}", "[a-z]{0,5}", proptest::num::u64::ANY), 0..3),
            applied in proptest::collection::vec("[a-z ]{0,9}", 0..3),
            ops in proptest::collection::vec("[a-z0-9]{0,300}", 0..3),
        ) {
            let messages: Vec<ContentId> = ids.into_iter().map(ContentId).collect();
            let usage: Vec<Usage> = usage
                .into_iter()
                .map(|(provider, model, n)| Usage {
                    provider,
                    model,
                    input: n,
                    output: n >> 7,
                    cache_read: n >> 20,
                    cache_write: 1,
                })
                .collect();
            let sem = TurnSemantics { messages: &messages, usage: &usage, applied_context: &applied, tool_ops: &ops };
            let bytes = crate::wire::to_bytes(&sem, u64::MAX).unwrap();
            let mut h = blake3::Hasher::new();
            h.update(TURN_DOMAIN);
            h.update(&bytes);
            proptest::prop_assert_eq!(turn_commit_hash(&messages, &usage, &applied, &ops).0, *h.finalize().as_bytes());
        }
    }

    /// The chain's step is SPEC §3's `blake3(c(i-1) || content_id(m(i)))`, and the revision
    /// of the first messages of a fixed list is pinned, so a change to the step fails here.
    #[test]
    fn revision_step_is_the_hash_of_both_ids() {
        let mut c = RevisionId::empty();
        for i in 0u8..50 {
            let m = content_id(&[i]);
            let mut h = blake3::Hasher::new();
            h.update(&c.0);
            h.update(&m.0);
            let next = c.extend(&m);
            assert_eq!(next.0, *h.finalize().as_bytes());
            c = next;
        }
        assert_eq!(crate::hex(&c.0), "bf2a5afa653236a221faa4c7265cff02c1c8f1a4fe0161bcb4e22d6b65ece85c");
    }

    #[test]
    fn revision_depends_only_on_messages() {
        let a = content_id(b"a");
        let b = content_id(b"b");
        assert_eq!(RevisionId::of(&[a, b]), RevisionId::empty().extend(&a).extend(&b));
        assert_ne!(RevisionId::of(&[a, b]), RevisionId::of(&[b, a]));
        assert_eq!(RevisionId::of(&[]), RevisionId::empty());
    }

    #[test]
    fn keyed_chain_differs_from_plain() {
        let plain = LogChain::plain();
        let keyed = LogChain::keyed([7; 32]);
        assert_ne!(plain.genesis(), keyed.genesis());
        let g = plain.genesis();
        assert_ne!(plain.next(&g, b"x"), keyed.next(&g, b"x"));
        assert!(plain.key_check().is_none());
        assert_ne!(keyed.key_check(), LogChain::keyed([8; 32]).key_check());
    }

    #[test]
    fn commit_hash_is_sensitive_to_every_semantic_field() {
        let m = [content_id(b"m")];
        let u = [Usage { provider: "p".into(), model: "m".into(), input: 1, output: 2, cache_read: 0, cache_write: 0 }];
        let base = turn_commit_hash(&m, &u, &[], &[]);
        assert_eq!(base, turn_commit_hash(&m, &u, &[], &[]));
        assert_ne!(base, turn_commit_hash(&m, &[], &[], &[]));
        assert_ne!(base, turn_commit_hash(&m, &u, &["k".into()], &[]));
        assert_ne!(base, turn_commit_hash(&m, &u, &[], &["op".into()]));
        assert_ne!(base, turn_commit_hash(&[], &u, &[], &[]));
    }
}
