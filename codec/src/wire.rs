//! The one bincode configuration every encoded byte in annal goes through.
//!
//! bincode 1.3.3 is pinned and used only through [`options`]: little-endian, varint
//! integers, a size limit on every call, and trailing bytes rejected. Maps are
//! `BTreeMap` everywhere, so encodings are canonical.

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A wire-level failure: the bytes do not decode as the expected type, or the value
/// does not fit the size limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The encoded size would exceed (or the input claims to exceed) the limit.
    #[error("encoded value exceeds the limit of {max} bytes")]
    TooLarge {
        /// The limit in bytes.
        max: u64,
    },
    /// The bytes ended before the value did.
    #[error("input ended early")]
    Truncated,
    /// Bytes remained after the value.
    #[error("trailing bytes after the value")]
    TrailingBytes,
    /// Any other structural problem (bad tag, invalid UTF-8, ...).
    #[error("malformed: {0}")]
    Malformed(String),
}

/// The bincode options: little-endian, varint, `limit` bytes, trailing bytes rejected.
pub fn options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new().with_little_endian().with_varint_encoding().with_limit(limit).reject_trailing_bytes()
}

fn classify(err: bincode::Error, limit: u64) -> WireError {
    let kind: &bincode::ErrorKind = &err;
    match kind {
        bincode::ErrorKind::SizeLimit => WireError::TooLarge { max: limit },
        bincode::ErrorKind::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => WireError::Truncated,
        bincode::ErrorKind::Custom(m) if m.contains("bytes remaining") => WireError::TrailingBytes,
        other => WireError::Malformed(other.to_string()),
    }
}

/// Encodes `value` canonically, failing if it would exceed `limit` bytes.
///
/// bincode enforces a limit on encoding with a separate sizing pass over the whole value
/// before the writing pass. The values encoded here are annal's own, already in memory,
/// so the encoding is written in one pass and its length checked against `limit` after:
/// the same bytes and the same error, at about half the work. (Decoding, where the bytes
/// are untrusted, keeps bincode's limit, enforced as it reads.)
pub fn to_bytes<T: Serialize + ?Sized>(value: &T, limit: u64) -> Result<Vec<u8>, WireError> {
    to_bytes_sized(value, limit, 128)
}

/// [`to_bytes`] into a buffer that starts with room for `capacity` bytes: for a value
/// whose size is about known (a message object, mostly its body), so the buffer does not
/// grow in steps and copy itself on the way.
pub fn to_bytes_sized<T: Serialize + ?Sized>(value: &T, limit: u64, capacity: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(capacity.min(limit as usize));
    options(limit).with_no_limit().serialize_into(&mut out, value).map_err(|e| classify(e, limit))?;
    if out.len() as u64 > limit {
        return Err(WireError::TooLarge { max: limit });
    }
    Ok(out)
}

/// Decodes exactly one `T` from `bytes`. bincode does not apply `limit` to a slice:
/// `bytes` bounds every read, and a length that claims more than is left fails as the
/// input ending early (`Truncated`). serde preallocates up to 1 MiB for a list's claimed
/// count; the lists of log records, message objects, projection rows and journalled
/// draft changes read through [`seq`] instead, which reserves at most
/// [`SEQ_PREALLOC_BYTES`] (a list nested in a tuple, a draft's segments, keeps serde's
/// bound). The callers bound `bytes` by the limit that applies (a record's by
/// `record_bytes_max`, in its header).
pub fn from_bytes<T: DeserializeOwned>(bytes: &[u8], limit: u64) -> Result<T, WireError> {
    options(limit).deserialize(bytes).map_err(|e| classify(e, limit))
}

/// [`from_bytes`] of a `T` that borrows from `bytes` (a `&str` or a `&[u8]` field points
/// into them instead of being copied): it accepts and refuses exactly the bytes
/// `from_bytes` of the owned type with the same fields does.
pub fn from_bytes_borrowed<'a, T: Deserialize<'a>>(bytes: &'a [u8], limit: u64) -> Result<T, WireError> {
    options(limit).deserialize(bytes).map_err(|e| classify(e, limit))
}

/// Decodes `bytes` laid out as an `H`, then a list of 32-byte ids, then a `T`: the fields
/// of one struct, in order, whose middle field is a `Vec` of 32-byte ids. It accepts and
/// refuses exactly the bytes [`from_bytes`] of that struct does, and gives the same
/// values. bincode's encoding of such a list is a varint count, then 32 raw bytes an id
/// (a fixed-size array of `u8` has no length and no framing), which bincode decodes
/// through serde a byte at a time; here each id is one copy. A turn's record holds its
/// messages' ids so, and decoding them a byte at a time was most of the cost of reading
/// a turn's record.
pub fn from_bytes_around_ids<H: DeserializeOwned, T: DeserializeOwned>(
    bytes: &[u8],
    limit: u64,
) -> Result<(H, Vec<[u8; 32]>, T), WireError> {
    // The prefix is read from a shrinking slice, with the slice's length as the limit: a
    // length that claims more than is left is the input ending early, refused before
    // anything is allocated for it.
    fn prefix<V: DeserializeOwned>(rest: &mut &[u8]) -> Result<V, WireError> {
        let left = rest.len() as u64;
        options(left).deserialize_from(rest).map_err(|e| match classify(e, left) {
            WireError::TooLarge { .. } => WireError::Truncated,
            other => other,
        })
    }
    let mut rest = bytes;
    let head: H = prefix(&mut rest)?;
    let count: u64 = prefix(&mut rest)?;
    let len = count.checked_mul(32).filter(|&n| n <= rest.len() as u64).ok_or(WireError::Truncated)? as usize;
    let (raw, tail) = rest.split_at(len);
    let ids = raw
        .chunks_exact(32)
        .map(|c| {
            let mut id = [0u8; 32];
            id.copy_from_slice(c);
            id
        })
        .collect();
    let tail: T = from_bytes(tail, limit)?;
    Ok((head, ids, tail))
}

/// The most bytes a list decoded from untrusted bytes reserves before its elements are
/// read ([`seq`]).
pub const SEQ_PREALLOC_BYTES: usize = 4096;

/// A serde adapter for the `Vec` fields of what is decoded from untrusted bytes (log
/// records, message objects, and the engine's projection rows and journalled draft
/// changes): `#[serde(deserialize_with = "annal_codec::wire::seq::deserialize")]`.
///
/// A list's encoding starts with its count, which the input claims. serde's own `Vec`
/// reserves room for up to 1 MiB of elements on that claim before it reads one, so a few
/// bytes claiming a long list made a decoder under a 64 KiB limit allocate 1 MiB. This
/// one reserves at most [`SEQ_PREALLOC_BYTES`] and grows only as elements are read:
/// each takes at least a byte of the input, which the decode limit bounds. It accepts and
/// refuses exactly the bytes serde's `Vec` does, and gives the same values; encoding is
/// unchanged.
pub mod seq {
    use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
    use std::fmt;
    use std::marker::PhantomData;

    /// Deserializes a list, reserving room for at most [`super::SEQ_PREALLOC_BYTES`] of
    /// elements up front.
    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        d.deserialize_seq(Capped(PhantomData))
    }

    struct Capped<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Capped<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let room = super::SEQ_PREALLOC_BYTES / std::mem::size_of::<T>().max(1);
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(room));
            while let Some(element) = seq.next_element()? {
                out.push(element);
            }
            Ok(out)
        }
    }
}

/// The encoded size of `value`, bounded by `limit`.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T, limit: u64) -> Result<u64, WireError> {
    options(limit).serialized_size(value).map_err(|e| classify(e, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_trailing_bytes() {
        let mut bytes = to_bytes(&7u64, 64).unwrap();
        bytes.push(0);
        assert_eq!(from_bytes::<u64>(&bytes, 64), Err(WireError::TrailingBytes));
    }

    #[test]
    fn rejects_truncation() {
        let bytes = to_bytes(&"hello".to_string(), 64).unwrap();
        assert_eq!(from_bytes::<String>(&bytes[..3], 64), Err(WireError::Truncated));
    }

    #[test]
    fn enforces_the_limit_on_claimed_lengths() {
        // A vector claiming u64::MAX elements must fail fast, not allocate.
        let bytes = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert!(from_bytes::<Vec<u8>>(&bytes, 1 << 20).is_err());
    }

    #[test]
    fn one_pass_encoding_matches_bincode_and_enforces_the_limit() {
        let text = "x".repeat(100);
        // 1 byte of length prefix and 100 bytes.
        assert_eq!(to_bytes(&text, 101).unwrap(), options(101).serialize(&text).unwrap());
        assert_eq!(to_bytes(&text, 101).unwrap().len(), 101);
        assert_eq!(to_bytes(&text, 100), Err(WireError::TooLarge { max: 100 }));
        assert_eq!(options(100).serialize(&text).map_err(|e| classify(e, 100)), Err(WireError::TooLarge { max: 100 }));
        let nested = (7u64, vec![[3u8; 32]; 5], Some("model".to_string()));
        assert_eq!(to_bytes(&nested, 1 << 20).unwrap(), options(1 << 20).serialize(&nested).unwrap());
    }

    #[test]
    fn varint_small_integers_take_one_byte() {
        assert_eq!(to_bytes(&5u64, 64).unwrap(), vec![5]);
    }
}
