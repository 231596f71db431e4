//! `annal-benches codecs`: how content objects compress under the codecs a storage
//! engine could pick, on two corpora, choosing by bytes saved per CPU microsecond.
//!
//! - **Codecs**: the engine's two compressions as it stores objects
//!   (`annal_codec::content::encode_object_as`: lz4, and zstd from 1 KiB with lz4 below),
//!   and zstd at levels 1 to 3 on every object, with and without a dictionary trained on a fifth of the
//!   corpus (every fifth object; the others are measured). Every codec follows the
//!   engine's rule: an object under `COMPRESS_BYTES_MIN` bytes, or one whose compressed
//!   form would not save an eighth, is stored raw (the time spent trying still counts).
//! - **Corpora**: the comparison workload's content (`workload::session_plan`: message
//!   bodies, context, compaction summaries), and objects in the shape of an agent
//!   transcript on a chat-completions API, made from this repository's own files: tool
//!   calls that read a file (JSON), tool results that carry a piece of it (JSON, up to
//!   16 KiB), and assistant and user messages taken from the docs' paragraphs.
//!
//! Each codec compresses and decompresses every measured object, and each result is
//! checked against the original, so a codec that loses a byte fails the run.

use crate::workload::{self, Op, Shape};
use annal_codec::content::{self, Compression, COMPRESS_BYTES_MIN};
use std::path::Path;
use std::time::{Duration, Instant};

/// A named list of content objects (canonical bytes).
pub struct Corpus {
    /// What the objects are.
    pub name: String,
    /// The objects.
    pub objects: Vec<Vec<u8>>,
}

/// One codec on one corpus.
#[derive(Clone, Debug)]
pub struct Measured {
    /// The codec.
    pub codec: String,
    /// Objects measured.
    pub objects: u64,
    /// Their canonical bytes.
    pub canonical_bytes: u64,
    /// Their bytes as stored (raw where compressing did not pay).
    pub stored_bytes: u64,
    /// Time spent compressing (trying, for the objects stored raw).
    pub compress: Duration,
    /// Time spent decompressing the compressed ones.
    pub decompress: Duration,
}

impl Measured {
    /// Stored bytes per canonical byte.
    pub fn ratio(&self) -> f64 {
        self.stored_bytes as f64 / self.canonical_bytes.max(1) as f64
    }

    /// Bytes saved per microsecond of compression.
    pub fn saved_per_compress_us(&self) -> f64 {
        self.saved() / (self.compress.as_secs_f64() * 1e6).max(1e-9)
    }

    /// Bytes saved per microsecond of compression and decompression.
    pub fn saved_per_cpu_us(&self) -> f64 {
        self.saved() / ((self.compress + self.decompress).as_secs_f64() * 1e6).max(1e-9)
    }

    fn saved(&self) -> f64 {
        self.canonical_bytes.saturating_sub(self.stored_bytes) as f64
    }
}

/// The comparison workload's content objects: `sessions` sessions of `ops` operations.
pub fn workload_corpus(sessions: u64, ops: usize) -> Corpus {
    let shape = Shape::agent();
    let mut objects = vec![workload::system_prompt(&shape, 42).body];
    for i in 0..sessions {
        for op in workload::session_plan(&shape, 42, i, ops) {
            match op {
                Op::Turn(t) => objects.extend(t.messages.into_iter().map(|m| m.body)),
                Op::Context { content, .. } => objects.push(content),
                Op::Compact { summary, .. } => objects.push(summary.body),
                Op::Restore | Op::Fork { .. } => {}
            }
        }
    }
    Corpus { name: "comparison workload".into(), objects }
}

/// Objects in the shape of an agent transcript, made from the files under `root`
/// (`.rs` sources read by tool calls, `.md` docs as the conversation's prose), in a
/// fixed order.
pub fn transcript_corpus(root: &Path) -> std::io::Result<Corpus> {
    let mut sources = Vec::new();
    let mut docs = Vec::new();
    collect(root, root, &mut sources, &mut docs)?;
    sources.sort();
    docs.sort();
    let mut prose: Vec<String> = Vec::new();
    for (_, text) in &docs {
        let mut message = String::new();
        for paragraph in text.split("\n\n") {
            message.push_str(paragraph);
            message.push_str("\n\n");
            if message.len() >= 600 {
                prose.push(std::mem::take(&mut message));
            }
        }
        if !message.trim().is_empty() {
            prose.push(message);
        }
    }
    let mut prose = prose.into_iter().cycle();
    let mut objects = Vec::new();
    let mut call = 0u64;
    for (path, text) in &sources {
        let user = prose.next().unwrap_or_default();
        objects.push(serde_json::json!({"role": "user", "content": user}).to_string().into_bytes());
        let mut rest = text.as_str();
        while !rest.is_empty() {
            call += 1;
            let mut end = rest.len().min(16 << 10);
            while !rest.is_char_boundary(end) {
                end -= 1;
            }
            let (piece, tail) = rest.split_at(end);
            rest = tail;
            let id = format!("toolu_{call:016x}");
            let input = serde_json::json!({"path": path, "offset": text.len() - rest.len() - piece.len()});
            let tool_use = serde_json::json!({"role": "assistant", "content": [
                {"type": "text", "text": "Reading the file."},
                {"type": "tool_use", "id": id, "name": "read_file", "input": input}]});
            objects.push(tool_use.to_string().into_bytes());
            let result = serde_json::json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": piece}]});
            objects.push(result.to_string().into_bytes());
        }
        let answer = prose.next().unwrap_or_default();
        let assistant = serde_json::json!({"role": "assistant", "content": [{"type": "text", "text": answer}]});
        objects.push(assistant.to_string().into_bytes());
    }
    Ok(Corpus {
        name: "agent transcripts (this repository's files as tool results, its docs as prose)".into(),
        objects,
    })
}

fn collect(
    root: &Path,
    dir: &Path,
    sources: &mut Vec<(String, String)>,
    docs: &mut Vec<(String, String)>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "fuzz" {
                collect(root, &path, sources, docs)?;
            }
            continue;
        }
        let relative = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
        let list = match path.extension().and_then(|e| e.to_str()) {
            Some("rs") => &mut *sources,
            Some("md") => &mut *docs,
            _ => continue,
        };
        if let Ok(text) = std::fs::read_to_string(&path) {
            list.push((relative, text));
        }
    }
    Ok(())
}

/// Measures every codec on `corpus`.
pub fn measure(corpus: &Corpus) -> Vec<Measured> {
    let train: Vec<&[u8]> = corpus.objects.iter().step_by(5).map(Vec::as_slice).collect();
    let test: Vec<&[u8]> =
        corpus.objects.iter().enumerate().filter(|(i, _)| i % 5 != 0).map(|(_, o)| o.as_slice()).collect();
    let dictionary = zstd::dict::from_samples(&train, 64 << 10).unwrap_or_default();
    let mut out = vec![
        stored_as(&test, "lz4 (lz4_flex block, as stored)", Compression::Lz4),
        stored_as(&test, "zstd 1 from 1 KiB, lz4 below (`Compression::Zstd`, as stored)", Compression::Zstd),
    ];
    for level in 1..=3 {
        out.push(zstd_measure(&test, level, None));
    }
    if !dictionary.is_empty() {
        for level in 1..=3 {
            out.push(zstd_measure(&test, level, Some(&dictionary)));
        }
    }
    out
}

/// The engine's own encoder under `compression` (`encode_object_as`), as it stores objects.
fn stored_as(objects: &[&[u8]], name: &str, compression: Compression) -> Measured {
    let mut m = empty(name, objects);
    for object in objects {
        let started = Instant::now();
        let (encoding, stored) = content::encode_object_as(object, compression);
        m.compress += started.elapsed();
        m.stored_bytes += stored.len() as u64;
        let started = Instant::now();
        let back = content::decode_object(encoding, &stored, u64::MAX).expect("decodes what it encoded");
        m.decompress += started.elapsed();
        assert_eq!(&back[..], *object, "{name} round trip");
    }
    m
}

fn zstd_measure(objects: &[&[u8]], level: i32, dictionary: Option<&[u8]>) -> Measured {
    let name = match dictionary {
        Some(d) => format!("zstd {level}, {} KiB dictionary", d.len() >> 10),
        None => format!("zstd {level}"),
    };
    let mut m = empty(&name, objects);
    let (mut compressor, mut decompressor) = match dictionary {
        Some(d) => (
            zstd::bulk::Compressor::with_dictionary(level, d).expect("compressor"),
            zstd::bulk::Decompressor::with_dictionary(d).expect("decompressor"),
        ),
        None => (
            zstd::bulk::Compressor::new(level).expect("compressor"),
            zstd::bulk::Decompressor::new().expect("decompressor"),
        ),
    };
    for object in objects {
        if object.len() < COMPRESS_BYTES_MIN {
            m.stored_bytes += object.len() as u64;
            continue;
        }
        let started = Instant::now();
        let compressed = compressor.compress(object).expect("zstd compresses");
        m.compress += started.elapsed();
        if compressed.len() > object.len() - object.len() / 8 {
            m.stored_bytes += object.len() as u64;
            continue;
        }
        m.stored_bytes += compressed.len() as u64 + 4;
        let started = Instant::now();
        let back = decompressor.decompress(&compressed, object.len()).expect("zstd decompresses");
        m.decompress += started.elapsed();
        assert_eq!(&back[..], *object, "zstd round trip");
    }
    m
}

fn empty(codec: &str, objects: &[&[u8]]) -> Measured {
    Measured {
        codec: codec.into(),
        objects: objects.len() as u64,
        canonical_bytes: objects.iter().map(|o| o.len() as u64).sum(),
        stored_bytes: 0,
        compress: Duration::ZERO,
        decompress: Duration::ZERO,
    }
}

/// The results of one corpus as a markdown table.
pub fn markdown(corpus: &Corpus, results: &[Measured]) -> String {
    let measured = results.first().map_or(0, |m| m.objects);
    let bytes = results.first().map_or(0, |m| m.canonical_bytes);
    let mut out = format!(
        "{}: {} objects, {} measured ({} bytes; the rest trains the dictionary)\n\n",
        corpus.name,
        corpus.objects.len(),
        measured,
        bytes
    );
    out.push_str("| codec | stored / canonical | compress MB/s | decompress MB/s | bytes saved per compress µs | bytes saved per CPU µs (both ways) |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|\n");
    for m in results {
        let mbs = |d: Duration| m.canonical_bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6;
        out.push_str(&format!(
            "| {} | {:.3} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            m.codec,
            m.ratio(),
            mbs(m.compress),
            mbs(m.decompress),
            m.saved_per_compress_us(),
            m.saved_per_cpu_us()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_and_saves_on_text() {
        let corpus = workload_corpus(3, 6);
        let results = measure(&corpus);
        assert!(results.len() >= 4, "lz4 and three zstd levels at least");
        for m in &results {
            assert_eq!(m.canonical_bytes, results[0].canonical_bytes, "{}", m.codec);
            assert!(m.ratio() < 0.9, "{} saves on the workload's text: {}", m.codec, m.ratio());
        }
        let table = markdown(&corpus, &results);
        assert_eq!(table.lines().filter(|l| l.starts_with("| zstd") || l.starts_with("| lz4")).count(), results.len());
    }

    #[test]
    fn the_transcript_corpus_is_made_of_json_messages() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let corpus = transcript_corpus(&root).unwrap();
        assert!(corpus.objects.len() > 100, "{}", corpus.objects.len());
        for object in &corpus.objects {
            let value: serde_json::Value = serde_json::from_slice(object).unwrap();
            assert!(value["role"].is_string());
        }
    }
}
