//! Identifiers: sessions, content objects, revisions and chain hashes.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Error returned when a textual identifier cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: expected {expected_hex_len} hex digits, found {found:?}")]
pub struct ParseIdError {
    /// Which identifier was being parsed.
    pub what: &'static str,
    /// How many hex digits a valid identifier has.
    pub expected_hex_len: usize,
    /// The text that failed to parse.
    pub found: String,
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

pub(crate) fn hex_decode<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N], ParseIdError> {
    let err = || ParseIdError { what, expected_hex_len: N * 2, found: text.to_string() };
    let digits: Vec<u8> = text.bytes().filter(|c| *c != b'-').collect();
    if digits.len() != N * 2 {
        return Err(err());
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let hi = hex_value(pair[0]).ok_or_else(err)?;
        let lo = hex_value(pair[1]).ok_or_else(err)?;
        out[i] = (hi << 4) | lo;
    }
    Ok(out)
}

macro_rules! hash_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The raw 32 bytes.
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }

            /// Lower-case hex, 64 digits.
            pub fn to_hex(&self) -> String {
                hex(&self.0)
            }

            /// The first 12 hex digits, for human-readable output.
            pub fn short(&self) -> String {
                hex(&self.0[..6])
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.short())
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                hex_decode::<32>(s, $what).map($name)
            }
        }
    };
}

hash_id!(
    /// blake3 of the canonical bytes of a content object (message, context text,
    /// tool arguments or result, attachment).
    ContentId,
    "content id"
);
hash_id!(
    /// The hash-chain value of a transcript: `c(n)` over its `n` message content ids.
    /// Equal messages give an equal id.
    RevisionId,
    "revision id"
);
hash_id!(
    /// The log's record chain value `h(seq)`, which makes the log tamper-evident.
    ChainHash,
    "chain hash"
);
hash_id!(
    /// blake3 of the canonical encoding of a turn's semantic content.
    CommitHash,
    "commit hash"
);

/// A session identifier: 16 bytes, UUIDv7 by default so that ids sort by creation.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionId(pub [u8; 16]);

impl SessionId {
    /// The raw 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Canonical UUID text form, `8-4-4-4-12` lower-case hex digits.
    pub fn to_uuid_string(&self) -> String {
        let h = hex(&self.0);
        format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_uuid_string())
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({})", self.to_uuid_string())
    }
}

impl FromStr for SessionId {
    type Err = ParseIdError;
    /// Accepts 32 hex digits, with or without the UUID hyphens.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        hex_decode::<16>(s, "session id").map(SessionId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Listed(#[serde(with = "id_list")] Vec<ContentId>);

    #[test]
    fn an_id_list_is_its_length_and_the_raw_ids() {
        let ids = Listed(vec![ContentId([1; 32]), ContentId([2; 32])]);
        let bytes = crate::wire::to_bytes(&ids, 1 << 10).unwrap();
        // varint length 64, then the two ids as they are.
        let mut expected = vec![64u8];
        expected.extend([1u8; 32]);
        expected.extend([2u8; 32]);
        assert_eq!(bytes, expected);
        assert_eq!(crate::wire::from_bytes::<Listed>(&bytes, 1 << 10).unwrap(), ids);
        let empty = crate::wire::to_bytes(&Listed(Vec::new()), 16).unwrap();
        assert_eq!(empty, vec![0u8]);
        assert_eq!(crate::wire::from_bytes::<Listed>(&empty, 16).unwrap(), Listed(Vec::new()));
    }

    #[test]
    fn an_id_list_of_a_length_not_a_multiple_of_32_is_an_error() {
        let mut bytes = vec![33u8];
        bytes.extend([7u8; 33]);
        assert!(crate::wire::from_bytes::<Listed>(&bytes, 1 << 10).is_err());
        // A length past the input or the limit fails without allocating it.
        assert!(crate::wire::from_bytes::<Listed>(&[0xfc, 0xff, 0xff, 0xff, 0x7f], 1 << 10).is_err());
    }

    #[test]
    fn session_id_round_trips_through_text() {
        let id = SessionId([0x01, 0x8f, 0x2a, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 0xff]);
        let text = id.to_string();
        assert_eq!(text, "018f2a00-0000-7000-8000-0000000000ff");
        assert_eq!(text.parse::<SessionId>().unwrap(), id);
        assert_eq!(text.replace('-', "").parse::<SessionId>().unwrap(), id);
    }

    #[test]
    fn bad_hex_is_an_error() {
        assert!("zz".parse::<ContentId>().is_err());
        assert!("abc".parse::<SessionId>().is_err());
        let long = "0".repeat(66);
        assert!(long.parse::<RevisionId>().is_err());
    }
}

/// A serde adapter (`#[serde(with = "annal_codec::ids::id_list")]`) that encodes a list of
/// content ids as one byte string: its length, then 32 bytes an id. The list decodes in
/// one copy, where the default encoding (a sequence of 32-element tuples, which log
/// records keep) decodes byte by byte. Projection rows that hold long lists use it: a
/// revision graph node's recipe holds up to a whole command's messages.
pub mod id_list {
    use super::ContentId;
    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use serde::Serializer;
    use std::fmt;

    /// `ids` packed: 32 bytes an id, one after the other (the byte string's contents, and
    /// the value of the log file's `content_ids` table).
    pub fn pack(ids: &[ContentId]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(ids.len() * 32);
        for id in ids {
            bytes.extend_from_slice(&id.0);
        }
        bytes
    }

    /// The ids `bytes` packs ([`pack`]); `None` when its length is not a multiple of 32.
    pub fn unpack(bytes: &[u8]) -> Option<Vec<ContentId>> {
        if !bytes.len().is_multiple_of(32) {
            return None;
        }
        Some(
            bytes
                .chunks_exact(32)
                .map(|c| {
                    let mut id = [0u8; 32];
                    id.copy_from_slice(c);
                    ContentId(id)
                })
                .collect(),
        )
    }

    /// Serializes `ids` as one byte string.
    pub fn serialize<S: Serializer>(ids: &[ContentId], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&pack(ids))
    }

    /// Deserializes a byte string whose length is a multiple of 32 into content ids.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ContentId>, D::Error> {
        d.deserialize_bytes(IdList)
    }

    struct IdList;

    impl<'de> Visitor<'de> for IdList {
        type Value = Vec<ContentId>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a byte string of 32-byte content ids")
        }

        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
            unpack(v).ok_or_else(|| E::invalid_length(v.len(), &self))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            // Formats without byte strings hand the bytes over one at a time.
            let mut bytes = Vec::new();
            while let Some(b) = seq.next_element::<u8>()? {
                bytes.push(b);
            }
            self.visit_bytes(&bytes)
        }
    }
}
