//! # annal-codec
//!
//! Bytes ⟷ records for the annal session store. This crate knows no database: it
//! defines the event catalogue, the record envelope with its format magic, kind byte,
//! per-kind schema version and chain hash, the canonical encoding (bincode 1.3.3 through
//! one explicit [`wire::options`]), and the hash functions of the format.
//!
//! ```
//! use annal_codec::*;
//!
//! let record = Record {
//!     seq: 1,
//!     session: SessionId([1; 16]),
//!     stream_seq: 1,
//!     committed_at_ms: 1_700_000_000_000,
//!     event: Event::SessionArchived(SessionArchived { reason: "done".into() }),
//! };
//! let chain = LogChain::plain();
//! let (bytes, h1) = encode_record(&record, &chain.genesis(), &chain, 1 << 20).unwrap();
//! let decoded = decode_record(&bytes, 1 << 20).unwrap();
//! assert_eq!(decoded.record, record);
//! assert_eq!(verify_chain(&bytes, &chain.genesis(), &chain, 1).unwrap(), h1);
//! ```
#![deny(missing_docs)]

pub mod content;
pub mod event;
pub mod hash;
pub mod ids;
pub mod record;
pub mod wire;

pub use event::*;
pub use hash::{content_id, turn_commit_hash, turn_commit_hash_with_inputs, turn_commit_hash_with_state, LogChain};
pub use ids::{hex, ChainHash, CommitHash, ContentId, ParseIdError, RevisionId, SessionId};
pub use record::{
    chain_link, decode_header, decode_message, decode_payload, decode_record, encode_message, encode_message_parts,
    encode_record, encode_record_as, erase_record, message_attachments, record_len, reseal, stored_chain_hash,
    verify_chain, DecodeError, DecodedRecord, Header, Record, ERASED_RECORD_LEN, FORMAT_VERSION, FORMAT_VERSION_V1,
    HASH_LEN, HEADER_LEN, MAGIC, MAGIC_ERASED, RECORD_LEN_MIN,
};
pub use wire::WireError;
