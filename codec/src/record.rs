//! The record envelope: fixed header, payload, chain hash.
//!
//! ```text
//! offset  size  field
//!  0       4    magic "ANNL" ("ANNE": an erased record, below)
//!  4       1    record format version (2; 1 is still read)
//!  5       1    event kind byte
//!  6       2    schema version of the kind, u16 little-endian
//!  8       8    global sequence, u64 LE
//! 16      16    session id
//! 32       8    stream sequence, u64 LE
//! 40       8    committed_at, unix milliseconds, u64 LE
//! 48       4    payload length n, u32 LE
//! 52       n    payload: the kind's struct, bincode (LE, varint)
//! 52+n    32    chain hash h(seq)
//! ```
//!
//! Format 2 chains the header and a digest of the payload,
//! `h(seq) = H(h(seq-1) || bytes[0..52] || D)` with `D = LogChain::payload_digest(payload)`,
//! so a purge can erase the payload and keep the chain: an **erased record** is the same
//! header under the magic "ANNE" (the chain hashes it with "ANNL"), then `D` in place of
//! the payload, then the same `h(seq)`: 116 bytes whatever `n` was. Format 1 chained
//! the whole record, `h(seq) = H(h(seq-1) || bytes[0..52+n])`; its records are read and
//! verified under that rule, and cannot be erased without re-sealing the chain from
//! them on ([`reseal`]).

use crate::event::*;
use crate::hash::LogChain;
use crate::ids::{ChainHash, ContentId, SessionId};
use crate::wire::{self, WireError};
use serde::de::DeserializeOwned;

/// The four magic bytes that open every record.
pub const MAGIC: [u8; 4] = *b"ANNL";
/// The magic of an erased record: its payload replaced by the payload's digest.
pub const MAGIC_ERASED: [u8; 4] = *b"ANNE";
/// The record format version this binary writes (the chain covers a payload digest).
pub const FORMAT_VERSION: u8 = 2;
/// The previous record format (the chain covers the payload bytes), still read.
pub const FORMAT_VERSION_V1: u8 = 1;
/// Bytes of an erased record: header, payload digest, chain hash.
pub const ERASED_RECORD_LEN: usize = HEADER_LEN + 32 + HASH_LEN;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 52;
/// Bytes of the trailing chain hash.
pub const HASH_LEN: usize = 32;
/// Smallest possible record.
pub const RECORD_LEN_MIN: usize = HEADER_LEN + HASH_LEN;

/// A decoded log record: the envelope and its event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Global sequence number, dense from 1.
    pub seq: u64,
    /// The session the event belongs to.
    pub session: SessionId,
    /// Per-session sequence number, dense from 1.
    pub stream_seq: u64,
    /// Writer clock, unix milliseconds, never decreasing.
    pub committed_at_ms: u64,
    /// The event.
    pub event: Event,
}

/// A record read back from bytes, with the facts the decoder saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedRecord {
    /// The record, upcast to the current schema.
    pub record: Record,
    /// The schema version found on disk.
    pub schema_version: u16,
    /// The stored chain hash `h(seq)`.
    pub chain_hash: ChainHash,
    /// The record format found on disk ([`FORMAT_VERSION`] or [`FORMAT_VERSION_V1`]).
    pub format: u8,
}

/// Why bytes are not a valid record. Decoding never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the structure requires.
    #[error("truncated: needed {needed} bytes, found {found}")]
    Truncated {
        /// Bytes required.
        needed: u64,
        /// Bytes present.
        found: u64,
    },
    /// Bytes after the end of the structure.
    #[error("{extra} trailing bytes")]
    TrailingBytes {
        /// How many.
        extra: u64,
    },
    /// The magic is wrong: not an annal record.
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// What was found.
        found: [u8; 4],
    },
    /// The record format version is not this binary's.
    #[error("unsupported record format {found} (this binary reads {supported})")]
    UnsupportedFormat {
        /// Found on disk.
        found: u8,
        /// Supported by this binary.
        supported: u8,
    },
    /// The kind byte is unknown to this binary.
    #[error("unknown event kind {kind}")]
    UnknownKind {
        /// The kind byte.
        kind: u8,
    },
    /// The kind's schema version is not readable by this binary.
    #[error("{kind}: unsupported schema version {found} (this binary supports {supported})")]
    UnsupportedVersion {
        /// Event kind.
        kind: EventKind,
        /// Found on disk.
        found: u16,
        /// The newest version this binary supports.
        supported: u16,
    },
    /// Larger than the configured limit.
    #[error("{size} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Claimed or actual size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The stored chain hash does not follow from the previous one.
    #[error("chain hash mismatch at seq {seq}")]
    ChainMismatch {
        /// The record's sequence number.
        seq: u64,
    },
    /// A stored content object does not decode (bad compressed block, unknown encoding).
    #[error("bad content: {detail}")]
    BadContent {
        /// What is wrong.
        detail: String,
    },
    /// The payload does not decode as its kind.
    #[error("{kind}: malformed payload: {detail}")]
    Malformed {
        /// Event kind.
        kind: EventKind,
        /// What the wire decoder said.
        detail: String,
    },
}

/// Applies `$body` to the payload struct of `$event`, whatever its kind: the one place
/// that lists the kinds' payload types for encoding.
macro_rules! with_payload {
    ($event:expr, $e:ident => $body:expr, erased => $erased:expr) => {
        match $event {
            Event::SessionCreated($e) => $body,
            Event::TurnCommitted($e) => $body,
            Event::TranscriptRewritten($e) => $body,
            Event::SessionArchived($e) => $body,
            Event::SessionRevived($e) => $body,
            Event::ContextAppended($e) => $body,
            Event::ToolCallRecorded($e) => $body,
            Event::ToolResultRecorded($e) => $body,
            Event::LabelsChanged($e) => $body,
            Event::MetadataSet($e) => $body,
            Event::HostStateChanged($e) => $body,
            Event::LeaseAcquired($e) => $body,
            Event::LeaseReleased($e) => $body,
            Event::InputEnqueued($e) => $body,
            Event::InputsClaimed($e) => $body,
            Event::ClaimAbandoned($e) => $body,
            Event::InputCancelled($e) => $body,
            Event::SessionPurged($e) => $body,
            Event::Erased(_) => $erased,
        }
    };
}

fn encode_payload(event: &Event, limit: u64) -> Result<Vec<u8>, WireError> {
    with_payload!(event, e => wire::to_bytes(e, limit), erased => Ok(Vec::new()))
}

/// The encoded size of a whole record carrying `event`. The envelope has a fixed size,
/// so it does not depend on where in the log the record lands. Nothing is allocated.
pub fn record_len(event: &Event) -> Result<u64, WireError> {
    let payload = with_payload!(event, e => wire::encoded_len(e, u64::MAX), erased => {
        return Ok(ERASED_RECORD_LEN as u64)
    })?;
    Ok((RECORD_LEN_MIN as u64).saturating_add(payload))
}

fn push_header(out: &mut Vec<u8>, magic: [u8; 4], format: u8, kind: EventKind, schema: u16, r: &Record, n: u32) {
    out.extend_from_slice(&magic);
    out.push(format);
    out.push(kind.byte());
    out.extend_from_slice(&schema.to_le_bytes());
    out.extend_from_slice(&r.seq.to_le_bytes());
    out.extend_from_slice(&r.session.0);
    out.extend_from_slice(&r.stream_seq.to_le_bytes());
    out.extend_from_slice(&r.committed_at_ms.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
}

/// `h(seq)` of a format-2 record from its header (whichever magic it is stored under)
/// and its payload digest.
fn seal_v2(chain: &LogChain, prev: &ChainHash, header: &[u8], digest: &[u8]) -> ChainHash {
    let mut body = [0u8; HEADER_LEN + 32];
    body[..HEADER_LEN].copy_from_slice(&header[..HEADER_LEN]);
    body[..4].copy_from_slice(&MAGIC);
    body[HEADER_LEN..].copy_from_slice(&digest[..32]);
    chain.next(prev, &body)
}

/// Encodes a record in the current format and seals it with `h(seq)` computed from
/// `prev` (`h(seq-1)`). Returns the bytes and the new chain value. An [`Event::Erased`]
/// encodes as the erased record it was read from.
pub fn encode_record(
    record: &Record,
    prev: &ChainHash,
    chain: &LogChain,
    record_bytes_max: u64,
) -> Result<(Vec<u8>, ChainHash), DecodeError> {
    if let Event::Erased(e) = &record.event {
        let mut out = Vec::with_capacity(ERASED_RECORD_LEN);
        push_header(&mut out, MAGIC_ERASED, FORMAT_VERSION, e.kind, e.schema_version, record, e.payload_len);
        out.extend_from_slice(&e.payload_digest);
        let hash = seal_v2(chain, prev, &out, &e.payload_digest);
        out.extend_from_slice(&hash.0);
        return Ok((out, hash));
    }
    encode_record_as(record, FORMAT_VERSION, prev, chain, record_bytes_max)
}

/// Encodes a record in record format `format` (2, or 1 to reproduce a record written
/// before format 2) and seals it. Any other format is `UnsupportedFormat`.
pub fn encode_record_as(
    record: &Record,
    format: u8,
    prev: &ChainHash,
    chain: &LogChain,
    record_bytes_max: u64,
) -> Result<(Vec<u8>, ChainHash), DecodeError> {
    let kind = record.event.kind();
    if record.event.is_erased() || !(format == FORMAT_VERSION || format == FORMAT_VERSION_V1) {
        return Err(DecodeError::UnsupportedFormat { found: format, supported: FORMAT_VERSION });
    }
    let body_max = record_bytes_max.saturating_sub(RECORD_LEN_MIN as u64).min(u32::MAX as u64);
    let body = encode_payload(&record.event, body_max).map_err(|e| match e {
        WireError::TooLarge { max } => DecodeError::TooLarge { size: max + 1, max: record_bytes_max },
        other => DecodeError::Malformed { kind, detail: other.to_string() },
    })?;
    let mut out = Vec::with_capacity(RECORD_LEN_MIN + body.len());
    push_header(&mut out, MAGIC, format, kind, kind.current_version(), record, body.len() as u32);
    out.extend_from_slice(&body);
    let hash = if format == FORMAT_VERSION_V1 {
        chain.next(prev, &out)
    } else {
        seal_v2(chain, prev, &out, &chain.payload_digest(&body))
    };
    out.extend_from_slice(&hash.0);
    Ok((out, hash))
}

/// The erased form of a stored format-2 record: the same header under [`MAGIC_ERASED`],
/// the payload's digest in place of the payload, and the same chain hash, which
/// therefore still verifies. An erased record is returned as it is. A format-1 record
/// cannot be erased in place (its chain covers the payload): `UnsupportedFormat`.
pub fn erase_record(bytes: &[u8], chain: &LogChain, record_bytes_max: u64) -> Result<Vec<u8>, DecodeError> {
    let header = decode_header(bytes, record_bytes_max)?;
    if header.erased {
        return Ok(bytes.to_vec());
    }
    if header.format != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedFormat { found: header.format, supported: FORMAT_VERSION });
    }
    let end = HEADER_LEN + header.payload_len as usize;
    let mut out = Vec::with_capacity(ERASED_RECORD_LEN);
    out.extend_from_slice(&MAGIC_ERASED);
    out.extend_from_slice(&bytes[4..HEADER_LEN]);
    out.extend_from_slice(&chain.payload_digest(&bytes[HEADER_LEN..end]));
    out.extend_from_slice(&bytes[end..end + HASH_LEN]);
    Ok(out)
}

/// Seals a stored record again after `prev`, in the current format: a format-2 record
/// (whole or erased) keeps every byte but its chain hash; a format-1 record is decoded
/// and encoded in format 2. Used when a purge must erase a record of an older format,
/// which changes the chain from that record on. Returns the bytes and `h(seq)`.
pub fn reseal(
    bytes: &[u8],
    prev: &ChainHash,
    chain: &LogChain,
    record_bytes_max: u64,
) -> Result<(Vec<u8>, ChainHash), DecodeError> {
    let header = decode_header(bytes, record_bytes_max)?;
    if header.format == FORMAT_VERSION_V1 {
        let decoded = decode_record(bytes, record_bytes_max)?;
        return encode_record(&decoded.record, prev, chain, record_bytes_max);
    }
    let split = bytes.len() - HASH_LEN;
    let digest = if header.erased {
        <[u8; 32]>::try_from(&bytes[HEADER_LEN..split])
            .map_err(|_| DecodeError::Truncated { needed: ERASED_RECORD_LEN as u64, found: bytes.len() as u64 })?
    } else {
        chain.payload_digest(&bytes[HEADER_LEN..split])
    };
    let hash = seal_v2(chain, prev, bytes, &digest);
    let mut out = bytes[..split].to_vec();
    out.extend_from_slice(&hash.0);
    Ok((out, hash))
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// The parsed fixed header of a record, before its payload is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Kind byte, already checked to be known.
    pub kind: EventKind,
    /// Schema version on disk.
    pub schema_version: u16,
    /// Global sequence number.
    pub seq: u64,
    /// Session id.
    pub session: SessionId,
    /// Stream sequence.
    pub stream_seq: u64,
    /// Commit time, unix ms.
    pub committed_at_ms: u64,
    /// Payload length (of the payload that was there, for an erased record).
    pub payload_len: u32,
    /// Record format version.
    pub format: u8,
    /// Whether the record is erased: its payload replaced by the payload's digest.
    pub erased: bool,
}

/// Parses and checks the fixed header and the total length. Never panics.
pub fn decode_header(bytes: &[u8], record_bytes_max: u64) -> Result<Header, DecodeError> {
    if bytes.len() as u64 > record_bytes_max {
        return Err(DecodeError::TooLarge { size: bytes.len() as u64, max: record_bytes_max });
    }
    if bytes.len() < RECORD_LEN_MIN {
        return Err(DecodeError::Truncated { needed: RECORD_LEN_MIN as u64, found: bytes.len() as u64 });
    }
    let magic: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
    let erased = magic == MAGIC_ERASED;
    if magic != MAGIC && !erased {
        return Err(DecodeError::BadMagic { found: magic });
    }
    let format = bytes[4];
    if !(format == FORMAT_VERSION || (format == FORMAT_VERSION_V1 && !erased)) {
        return Err(DecodeError::UnsupportedFormat { found: format, supported: FORMAT_VERSION });
    }
    let kind = EventKind::from_byte(bytes[5]).ok_or(DecodeError::UnknownKind { kind: bytes[5] })?;
    let schema_version = u16::from_le_bytes([bytes[6], bytes[7]]);
    if schema_version > kind.current_version() || schema_version < kind.oldest_version() {
        return Err(DecodeError::UnsupportedVersion { kind, found: schema_version, supported: kind.current_version() });
    }
    let mut session = [0u8; 16];
    session.copy_from_slice(&bytes[16..32]);
    let payload_len = u32::from_le_bytes([bytes[48], bytes[49], bytes[50], bytes[51]]);
    let needed = if erased { ERASED_RECORD_LEN as u64 } else { RECORD_LEN_MIN as u64 + payload_len as u64 };
    let found = bytes.len() as u64;
    if found < needed {
        return Err(DecodeError::Truncated { needed, found });
    }
    if found > needed {
        return Err(DecodeError::TrailingBytes { extra: found - needed });
    }
    Ok(Header {
        kind,
        schema_version,
        seq: le_u64(&bytes[8..16]),
        session: SessionId(session),
        stream_seq: le_u64(&bytes[32..40]),
        committed_at_ms: le_u64(&bytes[40..48]),
        payload_len,
        format,
        erased,
    })
}

fn decode_as<T: DeserializeOwned>(kind: EventKind, bytes: &[u8], limit: u64) -> Result<T, DecodeError> {
    wire::from_bytes(bytes, limit).map_err(|e| wire_error(kind, bytes, e))
}

fn wire_error(kind: EventKind, bytes: &[u8], e: WireError) -> DecodeError {
    match e {
        WireError::TooLarge { max } => DecodeError::TooLarge { size: bytes.len() as u64, max },
        WireError::TrailingBytes => DecodeError::Malformed { kind, detail: "trailing bytes in payload".into() },
        other => DecodeError::Malformed { kind, detail: other.to_string() },
    }
}

/// The upcasting hook: decodes `payload` written with `schema_version` of `kind` into the
/// current event type. Each older version that is still supported has one arm here.
pub fn decode_payload(kind: EventKind, schema_version: u16, payload: &[u8], limit: u64) -> Result<Event, DecodeError> {
    if schema_version > kind.current_version() || schema_version < kind.oldest_version() {
        return Err(DecodeError::UnsupportedVersion { kind, found: schema_version, supported: kind.current_version() });
    }
    Ok(match (kind, schema_version) {
        (EventKind::ContextAppended, 0) => {
            let v0: ContextAppendedV0 = decode_as(kind, payload, limit)?;
            Event::ContextAppended(ContextAppended { key: v0.key, content: v0.content, source: String::new() })
        }
        (EventKind::TurnCommitted, 1) => {
            let v1: TurnCommittedV1 = decode_as(kind, payload, limit)?;
            Event::TurnCommitted(v1.into())
        }
        (EventKind::TurnCommitted, 2) => {
            let v2: TurnCommittedV2 = decode_as(kind, payload, limit)?;
            Event::TurnCommitted(v2.into())
        }
        (EventKind::SessionCreated, _) => {
            Event::SessionCreated(SessionCreated::from_bytes(payload, limit).map_err(|e| wire_error(kind, payload, e))?)
        }
        (EventKind::TurnCommitted, _) => {
            Event::TurnCommitted(TurnCommitted::from_bytes(payload, limit).map_err(|e| wire_error(kind, payload, e))?)
        }
        (EventKind::TranscriptRewritten, _) => Event::TranscriptRewritten(
            TranscriptRewritten::from_bytes(payload, limit).map_err(|e| wire_error(kind, payload, e))?,
        ),
        (EventKind::SessionArchived, _) => Event::SessionArchived(decode_as(kind, payload, limit)?),
        (EventKind::SessionRevived, _) => Event::SessionRevived(decode_as(kind, payload, limit)?),
        (EventKind::ContextAppended, _) => Event::ContextAppended(decode_as(kind, payload, limit)?),
        (EventKind::ToolCallRecorded, _) => Event::ToolCallRecorded(decode_as(kind, payload, limit)?),
        (EventKind::ToolResultRecorded, _) => Event::ToolResultRecorded(decode_as(kind, payload, limit)?),
        (EventKind::LabelsChanged, _) => Event::LabelsChanged(decode_as(kind, payload, limit)?),
        (EventKind::MetadataSet, _) => Event::MetadataSet(decode_as(kind, payload, limit)?),
        (EventKind::HostStateChanged, _) => Event::HostStateChanged(decode_as(kind, payload, limit)?),
        (EventKind::LeaseAcquired, _) => Event::LeaseAcquired(decode_as(kind, payload, limit)?),
        (EventKind::LeaseReleased, _) => Event::LeaseReleased(decode_as(kind, payload, limit)?),
        (EventKind::InputEnqueued, _) => Event::InputEnqueued(decode_as(kind, payload, limit)?),
        (EventKind::InputsClaimed, _) => Event::InputsClaimed(decode_as(kind, payload, limit)?),
        (EventKind::ClaimAbandoned, _) => Event::ClaimAbandoned(decode_as(kind, payload, limit)?),
        (EventKind::InputCancelled, _) => Event::InputCancelled(decode_as(kind, payload, limit)?),
        (EventKind::SessionPurged, _) => Event::SessionPurged(decode_as(kind, payload, limit)?),
    })
}

/// Decodes a whole record (header, payload, stored hash) without checking the chain.
/// Bounded by `record_bytes_max`; never panics.
pub fn decode_record(bytes: &[u8], record_bytes_max: u64) -> Result<DecodedRecord, DecodeError> {
    let header = decode_header(bytes, record_bytes_max)?;
    let end = if header.erased { HEADER_LEN + 32 } else { HEADER_LEN + header.payload_len as usize };
    let event = if header.erased {
        let mut payload_digest = [0u8; 32];
        payload_digest.copy_from_slice(&bytes[HEADER_LEN..end]);
        Event::Erased(Erased {
            kind: header.kind,
            schema_version: header.schema_version,
            payload_len: header.payload_len,
            payload_digest,
        })
    } else {
        decode_payload(header.kind, header.schema_version, &bytes[HEADER_LEN..end], record_bytes_max)?
    };
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&bytes[end..end + HASH_LEN]);
    Ok(DecodedRecord {
        record: Record {
            seq: header.seq,
            session: header.session,
            stream_seq: header.stream_seq,
            committed_at_ms: header.committed_at_ms,
            event,
        },
        schema_version: header.schema_version,
        chain_hash: ChainHash(hash),
        format: header.format,
    })
}

/// Checks that the stored hash of `bytes` follows from `prev` under the record's own
/// rule: `H(prev || header || payload digest)` for format 2 (an erased record stores the
/// digest), `H(prev || header || payload)` for format 1. Returns the stored hash, which
/// is `h(seq)`, on success.
pub fn verify_chain(bytes: &[u8], prev: &ChainHash, chain: &LogChain, seq: u64) -> Result<ChainHash, DecodeError> {
    if bytes.len() < RECORD_LEN_MIN {
        return Err(DecodeError::Truncated { needed: RECORD_LEN_MIN as u64, found: bytes.len() as u64 });
    }
    let split = bytes.len() - HASH_LEN;
    if bytes[..4] == MAGIC_ERASED && bytes.len() != ERASED_RECORD_LEN {
        return Err(DecodeError::ChainMismatch { seq });
    }
    let expected = chain_link(&bytes[..split], prev, chain);
    if expected.0[..] != bytes[split..] {
        return Err(DecodeError::ChainMismatch { seq });
    }
    Ok(expected)
}

/// `h(seq)` of a record whose bytes before the chain hash are `body`, after `prev`,
/// under the rule its magic and format byte name (format 2, whole or erased: the header
/// and the payload digest; anything else: every byte, as format 1). Never panics; it
/// checks nothing else (see [`verify_chain`] and [`decode_record`]).
pub fn chain_link(body: &[u8], prev: &ChainHash, chain: &LogChain) -> ChainHash {
    if body.len() < HEADER_LEN || body[4] != FORMAT_VERSION {
        return chain.next(prev, body);
    }
    if body[..4] == MAGIC_ERASED && body.len() == HEADER_LEN + 32 {
        return seal_v2(chain, prev, body, &body[HEADER_LEN..]);
    }
    if body[..4] == MAGIC {
        return seal_v2(chain, prev, body, &chain.payload_digest(&body[HEADER_LEN..]));
    }
    chain.next(prev, body)
}

/// The stored chain hash of an encoded record, without decoding the rest.
pub fn stored_chain_hash(bytes: &[u8]) -> Option<ChainHash> {
    if bytes.len() < RECORD_LEN_MIN {
        return None;
    }
    let mut h = [0u8; 32];
    h.copy_from_slice(&bytes[bytes.len() - HASH_LEN..]);
    Some(ChainHash(h))
}

/// Encodes a message object canonically.
pub fn encode_message(message: &MessageObject, limit: u64) -> Result<Vec<u8>, WireError> {
    encode_message_parts(message.role, &message.content_type, &message.body, &message.attachments, limit)
}

/// [`encode_message`] of a message object made of these parts, borrowed: the same bytes,
/// without first copying the body into a [`MessageObject`].
pub fn encode_message_parts(
    role: Role,
    content_type: &str,
    body: &[u8],
    attachments: &[ContentId],
    limit: u64,
) -> Result<Vec<u8>, WireError> {
    /// Serializes exactly as [`MessageObject`] does (fields in order; a `&str` and a
    /// `String`, a byte slice and a byte vector, a slice and a vector encode alike).
    #[derive(serde::Serialize)]
    struct Parts<'a> {
        role: Role,
        content_type: &'a str,
        #[serde(with = "serde_bytes")]
        body: &'a [u8],
        attachments: &'a [ContentId],
    }
    let capacity = body.len() + content_type.len() + attachments.len() * 33 + 24;
    wire::to_bytes_sized(&Parts { role, content_type, body, attachments }, limit, capacity)
}

/// Decodes a message object. Never panics; bounded by `limit`.
pub fn decode_message(bytes: &[u8], limit: u64) -> Result<MessageObject, WireError> {
    wire::from_bytes(bytes, limit)
}

/// The attachments of a message object: [`decode_message`]`(bytes, limit)` without its
/// copies of the body and the content type. It accepts and refuses exactly the bytes
/// `decode_message` does, with the same error.
pub fn message_attachments(bytes: &[u8], limit: u64) -> Result<Vec<ContentId>, WireError> {
    /// Deserializes exactly as [`MessageObject`] does, borrowing the body and the type.
    #[derive(serde::Deserialize)]
    struct Borrowed<'a> {
        #[allow(dead_code)]
        role: Role,
        #[allow(dead_code)]
        #[serde(borrow)]
        content_type: &'a str,
        #[allow(dead_code)]
        #[serde(borrow, with = "serde_bytes")]
        body: &'a [u8],
        #[serde(deserialize_with = "crate::wire::seq::deserialize")]
        attachments: Vec<ContentId>,
    }
    wire::from_bytes_borrowed::<Borrowed<'_>>(bytes, limit).map(|m| m.attachments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The borrowed encoder writes exactly the bytes of the owned one, and both
        /// refuse the same sizes.
        #[test]
        fn message_parts_encode_as_the_message_object(
            role in 0u8..4,
            content_type in "[a-z/+.-]{0,40}",
            body in proptest::collection::vec(any::<u8>(), 0..600),
            attachments in proptest::collection::vec(any::<[u8; 32]>(), 0..4),
            limit in 0u64..800,
        ) {
            let role = [Role::System, Role::User, Role::Assistant, Role::Tool][role as usize];
            let attachments: Vec<ContentId> = attachments.into_iter().map(ContentId).collect();
            let object = MessageObject { role, content_type: content_type.clone(), body: body.clone(), attachments: attachments.clone() };
            let owned = wire::to_bytes(&object, limit);
            let parts = encode_message_parts(role, &content_type, &body, &attachments, limit);
            prop_assert_eq!(owned, parts);
        }

        /// The borrowed decoder of the attachments accepts and refuses what the owned
        /// decoder does, with the same error: on encoded messages, cut or not, with a
        /// byte changed or not, under any limit.
        #[test]
        fn message_attachments_decode_as_the_message_object(
            role in 0u8..4,
            content_type in "[a-z/+.-]{0,20}",
            body in proptest::collection::vec(any::<u8>(), 0..300),
            attachments in proptest::collection::vec(any::<[u8; 32]>(), 0..4),
            cut in any::<prop::sample::Index>(),
            flip in proptest::option::of((any::<prop::sample::Index>(), 1u8..=255)),
            trailing in proptest::collection::vec(any::<u8>(), 0..3),
            limit in 0u64..500,
        ) {
            let role = [Role::System, Role::User, Role::Assistant, Role::Tool][role as usize];
            let attachments: Vec<ContentId> = attachments.into_iter().map(ContentId).collect();
            let mut bytes = encode_message_parts(role, &content_type, &body, &attachments, u64::MAX).unwrap();
            prop_assert_eq!(message_attachments(&bytes, u64::MAX), Ok(attachments));
            if let Some((at, x)) = flip {
                let at = at.index(bytes.len());
                bytes[at] ^= x;
            }
            bytes.extend_from_slice(&trailing);
            bytes.truncate(cut.index(bytes.len() + 1));
            let owned = decode_message(&bytes, limit).map(|m| m.attachments);
            prop_assert_eq!(message_attachments(&bytes, limit), owned);
        }

        /// And on any bytes at all.
        #[test]
        fn message_attachments_refuse_what_the_message_decoder_refuses(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            limit in 0u64..300,
        ) {
            let owned = decode_message(&bytes, limit).map(|m| m.attachments);
            prop_assert_eq!(message_attachments(&bytes, limit), owned);
        }
    }
}
