//! annal's log on a replicated NATS JetStream stream.
//!
//! [`JetStreamLog`] is the client that the JetStream log backend is built on
//! (`docs/design.md` §13): one stream per database, one subject per session
//! (`<prefix>.s.<session id in hex>`) and one for commands that write several sessions
//! (`<prefix>.x`). It connects with TLS and credentials, creates or checks the stream
//! (file storage, replicated, deletes and purges denied: the log only appends), and
//! offers what the engine needs of a log:
//!
//! - [`JetStreamLog::append`]: a batch of messages published without waiting for each
//!   acknowledgement in turn (pipelined), each with the per-session expectation it was
//!   decided under (`Nats-Expected-Last-Subject-Sequence`) and an idempotency key
//!   (`Nats-Msg-Id`), so that a retried publish is stored once;
//! - [`JetStreamLog::read`] and [`JetStreamLog::subscribe`]: the stream in order, from any
//!   stream sequence ([`JetStreamLog::read_from_leader`] reads without a consumer, which
//!   `read` falls back on when the servers place its consumer on a server that is down);
//! - [`JetStreamLog::tip`] and [`JetStreamLog::last_of`]: the stream's last sequence, and
//!   a subject's.
//!
//! The calls block. The client runs on a tokio runtime of its own with one worker
//! thread, so a host needs no async runtime, and the engine crate keeps none.
//!
//! [`JetStreamLog`] implements annal's [`LogBackend`](annal::backend::LogBackend): an
//! engine whose hosts share their log (`annal::Engine::open_shared`) can keep it on the
//! stream:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let url = "tls://annal:secret@10.0.0.1:4222,10.0.0.2:4222,10.0.0.3:4222/ANNAL?ca=/etc/annal/ca.pem";
//!     let stream = annal_jetstream::JetStreamLog::connect(&annal_jetstream::Options::from_url(url)?)?;
//!     let key = [7u8; 32]; // the chain key: every host the same
//!     let options = annal::Options { chain_key: Some(key), ..Default::default() };
//!     let engine = annal::Engine::open_shared("/var/lib/annal/host.redb", options, Arc::new(stream))?;
//!     // The same commands and queries as an embedded engine: each command is published to
//!     // the stream, and answered once this host's fold has taken it in.
//!     engine.close()?;
//!     Ok(())
//! }
//! ```
//!
//! The client's message types are the trait's own ([`Append`] is its `Publish`,
//! [`Outcome`] its `Published`); [`LogBackend::max_payload`](annal::backend::LogBackend::max_payload) leaves
//! room for the headers a publish carries ([`BACKEND_HEADER_ROOM`]).
//!
//! ```no_run
//! use annal_jetstream::{Append, Credentials, Expected, JetStreamLog, Options, Outcome, Target, Tls};
//! use annal_codec::SessionId;
//!
//! let options = Options {
//!     servers: vec!["tls://127.0.0.1:4222".into()],
//!     credentials: Credentials::UserPassword { user: "annal".into(), password: "secret".into() },
//!     tls: Tls { required: true, ca_file: Some("ca.pem".into()), client_cert: None },
//!     ..Options::default()
//! };
//! let log = JetStreamLog::connect(&options)?;
//! let session = SessionId([7; 16]);
//! let outcomes = log.append(vec![Append {
//!     target: Target::Session(session),
//!     payload: b"a record".to_vec(),
//!     expected: Expected::NoMessage,
//!     msg_id: Some("turn-1".into()),
//! }])?;
//! assert!(matches!(outcomes[0], Outcome::Stored { .. }));
//! for message in log.read(1, 100)? {
//!     println!("{} {:?} {} bytes", message.seq, message.target, message.payload.len());
//! }
//! # Ok::<(), annal_jetstream::Error>(())
//! ```

#![warn(missing_docs)]

use annal_codec::SessionId;
use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What can go wrong talking to the stream. Every error leaves the stream as it was,
/// except that a publish whose acknowledgement was lost ([`Error::Timeout`]) may have
/// been stored: retry it with the same `msg_id` and the server stores it once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The servers could not be reached, or the TLS handshake failed.
    #[error("cannot connect to the JetStream servers: {0}")]
    Connect(String),
    /// The servers refused the credentials, or the account may not do this.
    #[error("refused by the JetStream servers: {0}")]
    Refused(String),
    /// The stream does not exist and `Options::create` is off.
    #[error("stream {0} does not exist")]
    StreamNotFound(String),
    /// The stream exists with a configuration this client does not accept.
    #[error("stream {stream} is configured differently: {what}")]
    StreamMismatch {
        /// The stream.
        stream: String,
        /// What differs.
        what: String,
    },
    /// A message is larger than the servers accept. Nothing of its batch was sent.
    #[error("a message of {size} bytes is over the servers' limit of {max}")]
    PayloadTooLarge {
        /// The message's payload and headers, in bytes.
        size: usize,
        /// The servers' limit.
        max: usize,
    },
    /// No answer within `Options::timeout`.
    #[error("no answer from the JetStream servers within {0:?}")]
    Timeout(Duration),
    /// A message on the stream is not one this client wrote.
    #[error("stream sequence {seq}: {what}")]
    Malformed {
        /// Where.
        seq: u64,
        /// What.
        what: String,
    },
    /// Any other failure the servers or the client reported.
    #[error("JetStream: {0}")]
    Other(String),
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the client proves who it is. Its `Debug` masks the password, the seed and the
/// token.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// None: only for servers without authorization.
    #[default]
    None,
    /// A user and password of the servers' configuration.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// An NKey seed (`SU...`): the client signs the server's nonce with it.
    NKey(String),
    /// A credentials file (a user JWT and its NKey seed), as `nsc` writes them.
    CredsFile(PathBuf),
    /// An authorization token.
    Token(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::UserPassword { user, .. } => {
                f.debug_struct("UserPassword").field("user", user).field("password", &"***").finish()
            }
            Credentials::NKey(_) => f.debug_tuple("NKey").field(&"***").finish(),
            Credentials::CredsFile(path) => f.debug_tuple("CredsFile").field(path).finish(),
            Credentials::Token(_) => f.debug_tuple("Token").field(&"***").finish(),
        }
    }
}

/// TLS settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    /// Refuse a connection that is not TLS. On by default.
    pub required: bool,
    /// PEM file of the certificate authorities to trust (besides the system's).
    pub ca_file: Option<PathBuf>,
    /// PEM files of a client certificate and its key, for servers that verify clients
    /// (mutual TLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl Default for Tls {
    fn default() -> Self {
        Tls { required: true, ca_file: None, client_cert: None }
    }
}

/// Where the log is and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Server URLs (`tls://host:port` or `nats://host:port`); the client also learns the
    /// cluster's other servers from them.
    pub servers: Vec<String>,
    /// Who the client is.
    pub credentials: Credentials,
    /// TLS.
    pub tls: Tls,
    /// The stream's name: one stream per database. Default `ANNAL`.
    pub stream: String,
    /// The first token of the stream's subjects. Default `annal`.
    pub subject_prefix: String,
    /// Replicas of the stream when this client creates it. Default 3.
    pub replicas: usize,
    /// How long the servers remember a `msg_id`, to store a retried publish once.
    /// Default two minutes.
    pub duplicate_window: Duration,
    /// Create the stream if it does not exist. Default on.
    pub create: bool,
    /// How long a request or an acknowledgement may take. Default ten seconds.
    pub timeout: Duration,
    /// Publishes in flight at once, for one [`JetStreamLog::append`]: a batch longer
    /// than this awaits its oldest acknowledgement before each publish past it. Default
    /// 256.
    pub window: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            servers: vec!["tls://127.0.0.1:4222".into()],
            credentials: Credentials::None,
            tls: Tls::default(),
            stream: "ANNAL".into(),
            subject_prefix: "annal".into(),
            replicas: 3,
            duplicate_window: Duration::from_secs(120),
            create: true,
            timeout: Duration::from_secs(10),
            window: 256,
        }
    }
}

impl Options {
    /// Options from a URL, so that a command line can take a stream wherever it takes a
    /// file:
    ///
    /// ```text
    /// tls://[user[:password]@]host:port[,host:port...][/STREAM][?key=value&...]
    /// nats://...   the same, TLS not required
    /// ```
    ///
    /// The user and password may be percent-encoded. Keys: `ca` (a CA file), `cert` and
    /// `key` (a client certificate and its key, for mutual TLS), `creds` (a credentials
    /// file), `nkey` (a file holding an NKey seed), `token`, `prefix` (the subject
    /// prefix; default the stream's name in lower case, or `annal` for the default
    /// stream), `replicas`, `create` (`true` or `false`), `timeout_ms`. Anything else
    /// is an error, so a typo is not silently ignored.
    pub fn from_url(url: &str) -> Result<Options> {
        // The URL is quoted with its password and token masked: an error message must not
        // carry them into logs.
        let bad = |why: String| Error::Other(format!("JetStream URL {}: {why}", redact_url(url)));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme (tls:// or nats://)".into()))?;
        let required = match scheme {
            "tls" => true,
            "nats" => false,
            other => return Err(bad(format!("unknown scheme {other:?}"))),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (rest, stream) = match rest.split_once('/') {
            Some((r, s)) if !s.is_empty() => (r, Some(s.to_string())),
            Some((r, _)) => (r, None),
            None => (rest, None),
        };
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        if hosts.is_empty() {
            return Err(bad("no server".into()));
        }
        // Each server is checked here, so that a malformed one fails at once instead of
        // as a connection error that the caller retries (`server_addrs`, which the
        // connection parses them with too).
        let servers: Vec<String> = hosts.split(',').map(|h| format!("{scheme}://{h}")).collect();
        server_addrs(&servers).map_err(|e| match e {
            Error::Other(why) => bad(why),
            other => other,
        })?;
        let mut options = Options { servers, tls: Tls { required, ..Tls::default() }, ..Options::default() };
        if let Some(auth) = auth {
            let (user, password) = auth.split_once(':').unwrap_or((auth, ""));
            options.credentials = Credentials::UserPassword {
                user: percent_decode(user).map_err(|why| bad(format!("the user: {why}")))?,
                password: percent_decode(password).map_err(|why| bad(format!("the password: {why}")))?,
            };
        }
        if let Some(stream) = stream {
            options.subject_prefix = stream.to_lowercase();
            options.stream = stream;
        }
        let mut cert = None;
        let mut key = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| bad(format!("{pair:?} is not key=value")))?;
            let v = percent_decode(v).map_err(|why| bad(format!("{k}: {why}")))?;
            match k {
                "ca" => options.tls.ca_file = Some(PathBuf::from(v)),
                "cert" => cert = Some(PathBuf::from(v)),
                "key" => key = Some(PathBuf::from(v)),
                "creds" => options.credentials = Credentials::CredsFile(PathBuf::from(v)),
                "nkey" => {
                    let seed = std::fs::read_to_string(&v).map_err(|e| bad(format!("nkey file {v}: {e}")))?;
                    options.credentials = Credentials::NKey(seed.trim().to_string());
                }
                "token" => options.credentials = Credentials::Token(v),
                "prefix" => options.subject_prefix = v,
                "replicas" => options.replicas = v.parse().map_err(|_| bad(format!("replicas {v:?}")))?,
                "create" => options.create = v.parse().map_err(|_| bad(format!("create {v:?}")))?,
                "timeout_ms" => {
                    let ms: u64 = v.parse().map_err(|_| bad(format!("timeout_ms {v:?}")))?;
                    options.timeout = Duration::from_millis(ms);
                }
                other => return Err(bad(format!("unknown key {other:?}"))),
            }
        }
        match (cert, key) {
            (Some(c), Some(k)) => options.tls.client_cert = Some((c, k)),
            (None, None) => {}
            _ => return Err(bad("cert and key go together".into())),
        }
        Ok(options)
    }
}

/// Whether a command-line argument names a JetStream stream rather than a file.
pub fn is_url(arg: &str) -> bool {
    arg.starts_with("tls://") || arg.starts_with("nats://")
}

/// `url` with its password and its `token` masked (`***`), for messages and logs.
pub use annal::backend::redact_url;

/// Decodes `%XX` escapes. The error does not quote `s`, which may be a secret.
fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let escape = || format!("a bad percent escape at byte {i}");
            let hex = s.get(i + 1..i + 3).ok_or_else(escape)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| escape())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8"))
}

/// What a message writes, the state of its subject it was decided under, one message to
/// append, and what became of it: annal's own [`LogBackend`](annal::backend::LogBackend)
/// types, under the names this client has always used.
pub use annal::backend::{Expected, Publish as Append, Published as Outcome, Target};

/// A message read from the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    /// Its stream sequence (from 1, dense: the stream denies deletes).
    pub seq: u64,
    /// Its subject.
    pub target: Target,
    /// Its bytes.
    pub payload: Vec<u8>,
    /// Its idempotency key, if it had one.
    pub msg_id: Option<String>,
}

/// A client of annal's stream. Cheap to share between threads: every call takes `&self`.
pub struct JetStreamLog {
    runtime: Arc<tokio::runtime::Runtime>,
    client: async_nats::Client,
    context: jetstream::Context,
    stream: stream::Stream,
    options: Options,
}

impl std::fmt::Debug for JetStreamLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamLog").field("stream", &self.options.stream).finish_non_exhaustive()
    }
}

fn other(e: impl std::fmt::Display) -> Error {
    Error::Other(e.to_string())
}

/// The servers of `servers` (`nats://HOST:PORT`, `tls://…`) as the client connects to
/// them; a malformed one is [`Error::Other`] naming it.
fn server_addrs(servers: &[String]) -> Result<Vec<async_nats::ServerAddr>, Error> {
    servers.iter().map(|server| server.parse().map_err(|e| Error::Other(format!("server {server:?}: {e}")))).collect()
}

/// Authorization and permission failures are told apart by the servers' words: the
/// client library reports them as text.
fn refused_or(e: impl std::fmt::Display, otherwise: fn(String) -> Error) -> Error {
    let text = e.to_string();
    let lower = text.to_lowercase();
    if lower.contains("authorization") || lower.contains("permission") || lower.contains("authentication") {
        Error::Refused(text)
    } else {
        otherwise(text)
    }
}

impl JetStreamLog {
    /// Connects, then opens the stream (creating it if `options.create` and it is
    /// missing) and checks that it is one this client can use: its subjects are the
    /// prefix's, its storage is on file, and deletes and purges are denied. A lookup or
    /// creation that goes unanswered, or that a cluster still placing the stream says it
    /// cannot serve yet, is tried again until `options.timeout` has passed three times.
    pub fn connect(options: &Options) -> Result<JetStreamLog> {
        if options.servers.is_empty() {
            return Err(Error::Connect("no server URL given".into()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("annal-jetstream")
            .enable_all()
            .build()
            .map_err(|e| Error::Other(format!("cannot start the client's runtime: {e}")))?;
        let mut connect = async_nats::ConnectOptions::new()
            .name("annal")
            .connection_timeout(options.timeout)
            .request_timeout(Some(options.timeout))
            .require_tls(options.tls.required);
        if let Some(ca) = &options.tls.ca_file {
            connect = connect.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &options.tls.client_cert {
            connect = connect.add_client_certificate(cert.clone(), key.clone());
        }
        connect = match &options.credentials {
            Credentials::None => connect,
            Credentials::UserPassword { user, password } => connect.user_and_password(user.clone(), password.clone()),
            Credentials::NKey(seed) => connect.nkey(seed.clone()),
            Credentials::Token(token) => connect.token(token.clone()),
            Credentials::CredsFile(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Error::Connect(format!("cannot read {}: {e}", path.display())))?;
                connect.credentials(&text).map_err(|e| Error::Connect(format!("{}: {e}", path.display())))?
            }
        };
        // A malformed address is not a server that cannot be reached: `Other`, which no
        // caller retries.
        let servers = server_addrs(&options.servers)?;
        let (client, context, stream) = runtime.block_on(async {
            let client = connect.connect(servers).await.map_err(|e| refused_or(e, Error::Connect))?;
            // The window is kept by `append` itself (a call awaits its oldest
            // acknowledgement before it sends past it); the client's own permits, which a
            // publish holds until its acknowledgement is awaited, are many more, so that
            // no number of calls at once can hold them all and wait for each other.
            let context = jetstream::ContextBuilder::new()
                .timeout(options.timeout)
                .max_ack_inflight(ACK_PERMITS)
                .build(client.clone());
            let stream = open_stream(&context, options).await?;
            Ok::<_, Error>((client, context, stream))
        })?;
        Ok(JetStreamLog { runtime: Arc::new(runtime), client, context, stream, options: options.clone() })
    }

    /// The subject of `target`.
    pub fn subject(&self, target: &Target) -> String {
        subject(&self.options.subject_prefix, target)
    }

    /// The largest message the servers take, in bytes (payload and headers).
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    /// Publishes `batch` in order, without waiting for one acknowledgement before the
    /// next publish (at most `Options::window` in flight), and returns each message's
    /// outcome in the same order. A message refused for its expectation is a
    /// [`Outcome::Conflict`] and does not stop the others: each was decided under its own
    /// expectation. An error (a lost connection, a timeout) stops the call; messages
    /// before it may be stored, and a retry with the same `msg_id`s stores them once.
    pub fn append(&self, batch: Vec<Append>) -> Result<Vec<Outcome>> {
        let max = self.max_payload();
        for a in &batch {
            let size = a.payload.len() + header_bytes(a);
            if size > max {
                return Err(Error::PayloadTooLarge { size, max });
            }
        }
        let prefix = self.options.subject_prefix.clone();
        let window = self.options.window.max(1);
        self.runtime.block_on(async {
            let timeout = self.options.timeout;
            let settle = |ack: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>| match ack {
                Ok(ack) => Ok(Outcome::Stored { seq: ack.sequence, duplicate: ack.duplicate }),
                Err(e) if e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => Ok(Outcome::Conflict),
                Err(e) => Err(publish_error(e, timeout)),
            };
            let mut outcomes = Vec::with_capacity(batch.len());
            let mut pending = std::collections::VecDeque::with_capacity(window.min(batch.len()));
            for a in batch {
                // At most `window` in flight: the oldest is awaited before one more goes.
                if pending.len() >= window {
                    if let Some(ack) = pending.pop_front() {
                        outcomes.push(settle(ack.await)?);
                    }
                }
                let mut message = jetstream::message::PublishMessage::build().payload(a.payload.into());
                message = match a.expected {
                    Expected::Any => message,
                    Expected::NoMessage => message.expected_last_subject_sequence(0),
                    Expected::Last(seq) => message.expected_last_subject_sequence(seq),
                };
                if let Some(id) = &a.msg_id {
                    message = message.message_id(id);
                }
                let ack = self
                    .context
                    .send_publish(subject(&prefix, &a.target), message)
                    .await
                    .map_err(|e| publish_error(e, self.options.timeout))?;
                pending.push_back(ack);
            }
            for ack in pending {
                outcomes.push(settle(ack.await)?);
            }
            Ok(outcomes)
        })
    }

    /// Runs a request that changes nothing the log holds again until it succeeds, the
    /// servers refuse it, or `Options::timeout` has passed three times over: while the
    /// cluster elects a leader after a server is lost, a request can go unanswered or
    /// fail for a few seconds (a consumer created twice is an ephemeral one the servers
    /// drop when it idles).
    async fn retrying<T, E, F, Fut>(&self, mut request: F) -> std::result::Result<T, E>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, E>>,
    {
        let mut backoff = Backoff::new(self.options.timeout);
        loop {
            match request().await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let refused = matches!(refused_or(&e, Error::Other), Error::Refused(_));
                    if refused || !backoff.wait().await {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// The stream's last sequence (0 while it is empty).
    pub fn tip(&self) -> Result<u64> {
        self.runtime.block_on(async {
            let info = self.retrying(|| self.stream.get_info()).await.map_err(|e| refused_or(e, Error::Other))?;
            Ok(info.state.last_sequence)
        })
    }

    /// The stream sequence of the last message on `target`'s subject, if it has one: what
    /// [`Expected::Last`] takes.
    pub fn last_of(&self, target: &Target) -> Result<Option<u64>> {
        let subject = self.subject(target);
        self.runtime.block_on(async {
            let last = || async {
                match self.stream.get_last_raw_message_by_subject(&subject).await {
                    Ok(m) => Ok(Some(m.sequence)),
                    Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
                    Err(e) => Err(e),
                }
            };
            self.retrying(last).await.map_err(|e| refused_or(e, Error::Other))
        })
    }

    /// Up to `max` messages in stream order, from stream sequence `from` (1 is the first):
    /// fewer when the stream ends sooner. Every message the stream held when the call
    /// began is read (the stream's leader gives its last sequence first): a message this
    /// client's [`append`](Self::append) was told is stored is in any later read that
    /// reaches it.
    ///
    /// The messages come through an ephemeral consumer, in fetches of up to 4,096. The
    /// servers may place that consumer on a server that is down, or on one that has not
    /// stored the latest messages yet; when its creation goes unanswered for 2 s (or
    /// `Options::timeout`, if shorter), or a fetch brings nothing within the timeout, the
    /// rest are read from the stream's leader, as [`read_from_leader`](Self::read_from_leader)
    /// does. So a read while one server of the cluster is down takes at most that wait
    /// longer, and does not fail for it.
    pub fn read(&self, from: u64, max: usize) -> Result<Vec<StoredMessage>> {
        let Some((from, end)) = self.read_range(from, max)? else {
            return Ok(Vec::new());
        };
        self.runtime.block_on(async {
            let mut out = Vec::new();
            let config = consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: from },
                ack_policy: consumer::AckPolicy::None,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            };
            let wait = self.options.timeout.min(CONSUMER_WAIT);
            match tokio::time::timeout(wait, self.stream.create_consumer(config)).await {
                Ok(Ok(consumer)) => {
                    self.fetch_into(&consumer, from, end, &mut out).await?;
                    let name = consumer.cached_info().name.clone();
                    // The servers drop an idle ephemeral consumer by themselves; deleting
                    // it now only spares them the wait.
                    let _ = self.stream.delete_consumer(&name).await;
                }
                Ok(Err(e)) if matches!(refused_or(&e, Error::Other), Error::Refused(_)) => {
                    return Err(refused_or(format!("creating a consumer from {from}: {e}"), Error::Other));
                }
                // Unanswered, or a cluster that cannot place it now: the leader serves.
                Ok(Err(_)) | Err(_) => {}
            }
            let next = out.last().map_or(from, |m: &StoredMessage| m.seq + 1);
            if next <= end {
                self.get_into(next, end, &mut out).await?;
            }
            Ok(out)
        })
    }

    /// What [`read`](Self::read) returns, every message asked of the stream's leader, one
    /// request a message with up to 64 in flight: slower than a consumer's batched
    /// fetches on a healthy cluster, and served as long as the stream has a leader. It
    /// needs no permission to create consumers, only to get the stream's messages
    /// (`$JS.API.STREAM.MSG.GET.<stream>`).
    pub fn read_from_leader(&self, from: u64, max: usize) -> Result<Vec<StoredMessage>> {
        let Some((from, end)) = self.read_range(from, max)? else {
            return Ok(Vec::new());
        };
        self.runtime.block_on(async {
            let mut out = Vec::new();
            self.get_into(from, end, &mut out).await?;
            Ok(out)
        })
    }

    /// The sequences `from ..= end` a read of up to `max` messages from `from` covers, the
    /// stream's last sequence as its leader gives it bounding `end`; `None` when that is
    /// nothing. The stream is dense (no deletes, no purges): they are all there.
    fn read_range(&self, from: u64, max: usize) -> Result<Option<(u64, u64)>> {
        if max == 0 {
            return Ok(None);
        }
        let from = from.max(1);
        let last = self.tip()?;
        if last < from {
            return Ok(None);
        }
        let end = last.min(from.saturating_add(u64::try_from(max - 1).unwrap_or(u64::MAX)));
        Ok(Some((from, end)))
    }

    /// Fetches from `consumer`, which delivers from `from` on, into `out` until it holds
    /// every message up to `end`, or a fetch brings nothing (its server is down or behind:
    /// the caller reads the rest from the leader), or fails to arrive.
    async fn fetch_into(
        &self,
        consumer: &consumer::PullConsumer,
        from: u64,
        end: u64,
        out: &mut Vec<StoredMessage>,
    ) -> Result<()> {
        loop {
            let next = match out.last() {
                Some(m) if m.seq >= end => return Ok(()),
                Some(m) => m.seq + 1,
                None => from,
            };
            let want = usize::try_from(end - next + 1).unwrap_or(usize::MAX).min(4096);
            let Ok(mut batch) = consumer.fetch().max_messages(want).expires(self.options.timeout).messages().await
            else {
                return Ok(());
            };
            let before = out.len();
            while let Some(m) = batch.next().await {
                let Ok(m) = m else { return Ok(()) };
                let m = stored(&self.options.subject_prefix, &m)?;
                if m.seq != next + (out.len() - before) as u64 {
                    return Err(Error::Malformed { seq: m.seq, what: format!("delivered where {next} was due") });
                }
                if m.seq > end {
                    return Ok(());
                }
                out.push(m);
            }
            if out.len() == before {
                return Ok(());
            }
        }
    }

    /// Gets the messages `from ..= end` from the stream's leader into `out`, in order,
    /// with up to [`GETS_IN_FLIGHT`] requests at once, each tried again as
    /// [`retrying`](Self::retrying) does.
    async fn get_into(&self, from: u64, end: u64, out: &mut Vec<StoredMessage>) -> Result<()> {
        use futures_util::stream::{self as futures_stream, StreamExt as _};
        let prefix = &self.options.subject_prefix;
        let mut gets = futures_stream::iter(from..=end)
            .map(|seq| async move {
                let got = self.retrying(|| self.stream.get_raw_message(seq)).await;
                match got {
                    Ok(m) => stored_raw(prefix, seq, &m),
                    Err(e) => Err(match e.kind() {
                        stream::LastRawMessageErrorKind::NoMessageFound => {
                            Error::Malformed { seq, what: "missing from a stream that denies deletes".into() }
                        }
                        // The request went unanswered for three timeouts, its tries included.
                        stream::LastRawMessageErrorKind::Other
                            if !matches!(refused_or(&e, Error::Other), Error::Refused(_)) =>
                        {
                            Error::Timeout(self.options.timeout)
                        }
                        _ => refused_or(format!("getting message {seq}: {e}"), Error::Other),
                    }),
                }
            })
            .buffered(GETS_IN_FLIGHT);
        while let Some(m) = gets.next().await {
            out.push(m?);
        }
        Ok(())
    }

    /// Every message from stream sequence `from` on, as the servers store them: an
    /// ordered consumer that the client recreates past the last message it delivered if
    /// the servers lose it.
    pub fn subscribe(&self, from: u64) -> Result<Subscription> {
        let messages = self.runtime.block_on(async {
            let config = consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: from.max(1) },
                ..Default::default()
            };
            let consumer = self
                .retrying(|| self.stream.create_consumer(config.clone()))
                .await
                .map_err(|e| refused_or(format!("creating a consumer from {from}: {e}"), Error::Other))?;
            consumer.messages().await.map_err(other)
        })?;
        Ok(Subscription { runtime: self.runtime.clone(), messages, prefix: self.options.subject_prefix.clone() })
    }
}

/// The stream from some sequence on; see [`JetStreamLog::subscribe`].
pub struct Subscription {
    runtime: Arc<tokio::runtime::Runtime>,
    messages: consumer::pull::Ordered,
    prefix: String,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    /// The next message, waiting at most `wait` for it (`None` if none came).
    pub fn next_within(&mut self, wait: Duration) -> Result<Option<StoredMessage>> {
        let prefix = &self.prefix;
        let messages = &mut self.messages;
        self.runtime.block_on(async {
            match tokio::time::timeout(wait, messages.next()).await {
                Err(_) => Ok(None),
                Ok(None) => Err(Error::Other("the subscription ended".into())),
                Ok(Some(m)) => stored(prefix, &m.map_err(other)?).map(Some),
            }
        })
    }
}

/// The bytes that [`JetStreamLog`]'s [`LogBackend::max_payload`](annal::backend::LogBackend::max_payload)
/// keeps free under the servers' limit ([`JetStreamLog::max_payload`], which counts
/// headers) for the headers a publish adds. The most an expectation and a 64-byte
/// `msg_id` take is 150 bytes: the status line `NATS/1.0\r\n` (10),
/// `Nats-Expected-Last-Subject-Sequence: <20 digits>\r\n` (59),
/// `Nats-Msg-Id: <64 bytes>\r\n` (79) and the blank line (2). 256 covers that with room
/// to spare: a payload of the backend's largest size is taken under any expectation with
/// a `msg_id` of up to 170 bytes. A longer `msg_id` can still push a message over the
/// servers' limit; the append then fails with
/// [`BackendError::TooLarge`](annal::backend::BackendError::TooLarge) counting headers.
pub const BACKEND_HEADER_ROOM: usize = 256;

/// The same message, without its idempotency key (the trait does not read it back).
impl From<StoredMessage> for annal::backend::StreamMessage {
    fn from(m: StoredMessage) -> annal::backend::StreamMessage {
        annal::backend::StreamMessage { seq: m.seq, target: m.target, payload: m.payload }
    }
}

/// A timeout or a connection that failed is [`Unavailable`](annal::backend::BackendError::Unavailable)
/// (a message sent may be stored); refused credentials or permissions are
/// [`Refused`](annal::backend::BackendError::Refused); a message over the servers' limit is
/// [`TooLarge`](annal::backend::BackendError::TooLarge), its size counting headers; anything
/// else is [`Other`](annal::backend::BackendError::Other).
impl From<Error> for annal::backend::BackendError {
    fn from(e: Error) -> annal::backend::BackendError {
        use annal::backend::BackendError as B;
        match e {
            Error::Timeout(_) | Error::Connect(_) => B::Unavailable(e.to_string()),
            Error::Refused(why) => B::Refused(why),
            Error::PayloadTooLarge { size, max } => B::TooLarge { size: size as u64, max: max as u64 },
            e => B::Other(e.to_string()),
        }
    }
}

/// The client as annal's shared log: each call is the inherent method of the same name,
/// errors converted.
impl annal::backend::LogBackend for JetStreamLog {
    /// Refuses a batch with a payload over [`LogBackend::max_payload`](annal::backend::LogBackend::max_payload)
    /// before sending any of it; then [`JetStreamLog::append`]. The servers check an
    /// expectation against the messages they have applied: an
    /// [`Expected::Last`] that names a message of the
    /// same batch, still in flight, can be refused
    /// ([`Published::Conflict`](annal::backend::Published::Conflict)).
    fn append(
        &self,
        batch: Vec<annal::backend::Publish>,
    ) -> Result<Vec<annal::backend::Published>, annal::backend::BackendError> {
        let max = annal::backend::LogBackend::max_payload(self);
        if let Some(p) = batch.iter().find(|p| p.payload.len() as u64 > max) {
            return Err(annal::backend::BackendError::TooLarge { size: p.payload.len() as u64, max });
        }
        Ok(JetStreamLog::append(self, batch)?)
    }

    fn read(&self, from: u64, max: usize) -> Result<Vec<annal::backend::StreamMessage>, annal::backend::BackendError> {
        Ok(JetStreamLog::read(self, from, max)?.into_iter().map(Into::into).collect())
    }

    fn tip(&self) -> Result<u64, annal::backend::BackendError> {
        Ok(JetStreamLog::tip(self)?)
    }

    fn last_of(&self, target: &annal::backend::Target) -> Result<Option<u64>, annal::backend::BackendError> {
        Ok(JetStreamLog::last_of(self, target)?)
    }

    fn subscribe(&self, from: u64) -> Result<Box<dyn annal::backend::Subscription>, annal::backend::BackendError> {
        Ok(Box::new(BackendSubscription(JetStreamLog::subscribe(self, from)?)))
    }

    /// [`JetStreamLog::max_payload`] less [`BACKEND_HEADER_ROOM`] for the headers.
    fn max_payload(&self) -> u64 {
        JetStreamLog::max_payload(self).saturating_sub(BACKEND_HEADER_ROOM) as u64
    }
}

/// A [`Subscription`] as annal's.
struct BackendSubscription(Subscription);

impl annal::backend::Subscription for BackendSubscription {
    fn next_within(
        &mut self,
        wait: Duration,
    ) -> Result<Option<annal::backend::StreamMessage>, annal::backend::BackendError> {
        Ok(self.0.next_within(wait)?.map(Into::into))
    }
}

fn subject(prefix: &str, target: &Target) -> String {
    match target {
        Target::Session(s) => format!("{prefix}.s.{}", annal_codec::ids::hex(&s.0)),
        Target::Many => format!("{prefix}.x"),
    }
}

fn target_of(prefix: &str, subject: &str) -> Option<Target> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    if rest == "x" {
        return Some(Target::Many);
    }
    // The log writes 32 hex digits, without the UUID's hyphens.
    let hex = rest.strip_prefix("s.").filter(|h| h.len() == 32)?;
    hex.parse::<SessionId>().ok().map(Target::Session)
}

/// How long [`JetStreamLog::read`] waits for its consumer's creation before it reads from
/// the stream's leader instead: on a healthy cluster a creation is answered in
/// milliseconds; one placed on a server that is down is not answered at all.
const CONSUMER_WAIT: Duration = Duration::from_secs(2);

/// The client's permits for publishes whose acknowledgement is not awaited yet. A
/// publish holds one until it is; each `append` holds at most its window, so this many
/// let any number of appends at once go on without waiting for each other's.
const ACK_PERMITS: usize = 1 << 20;

/// Requests a read from the leader keeps in flight at once.
const GETS_IN_FLIGHT: usize = 64;

/// A message the leader answered a get of `seq` with.
fn stored_raw(prefix: &str, seq: u64, m: &jetstream::message::StreamMessage) -> Result<StoredMessage> {
    if m.sequence != seq {
        return Err(Error::Malformed { seq, what: format!("the leader answered with message {}", m.sequence) });
    }
    let target = target_of(prefix, m.subject.as_str())
        .ok_or_else(|| Error::Malformed { seq, what: format!("subject {} is not one of the log's", m.subject) })?;
    let msg_id = m.headers.get(async_nats::header::NATS_MESSAGE_ID).map(|v| v.as_str().to_owned());
    Ok(StoredMessage { seq, target, payload: m.payload.to_vec(), msg_id })
}

fn stored(prefix: &str, m: &jetstream::Message) -> Result<StoredMessage> {
    let seq = m.info().map_err(other)?.stream_sequence;
    let target = target_of(prefix, m.subject.as_str())
        .ok_or_else(|| Error::Malformed { seq, what: format!("subject {} is not one of the log's", m.subject) })?;
    let msg_id =
        m.headers.as_ref().and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID)).map(|v| v.as_str().to_owned());
    Ok(StoredMessage { seq, target, payload: m.payload.to_vec(), msg_id })
}

/// The bytes of the headers a publish of `a` carries, as the servers count them against
/// their payload limit: the status line, each `name: value` line, the blank line.
fn header_bytes(a: &Append) -> usize {
    let line = |name: &str, value: usize| name.len() + 2 + value + 2;
    let expected = match a.expected {
        Expected::Any => 0,
        Expected::NoMessage => line("Nats-Expected-Last-Subject-Sequence", 1),
        Expected::Last(seq) => line("Nats-Expected-Last-Subject-Sequence", seq.to_string().len()),
    };
    let id = a.msg_id.as_ref().map_or(0, |id| line("Nats-Msg-Id", id.len()));
    match expected + id {
        0 => 0,
        lines => "NATS/1.0\r\n".len() + lines + 2,
    }
}

fn publish_error(e: jetstream::context::PublishError, timeout: Duration) -> Error {
    use jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::TimedOut => Error::Timeout(timeout),
        K::StreamNotFound => Error::Other(format!("no stream takes the log's subjects: {e}")),
        _ => refused_or(e, Error::Other),
    }
}

fn stream_config(options: &Options) -> stream::Config {
    stream::Config {
        name: options.stream.clone(),
        subjects: vec![format!("{}.s.*", options.subject_prefix), format!("{}.x", options.subject_prefix)],
        storage: stream::StorageType::File,
        num_replicas: options.replicas,
        duplicate_window: options.duplicate_window,
        deny_delete: true,
        deny_purge: true,
        ..Default::default()
    }
}

/// The pauses between the tries of a request that may succeed when repeated: 100 ms,
/// then twice as long each time up to 2 s, until a request's timeout has passed three
/// times over (while a cluster elects a leader, requests go unanswered for a few seconds).
struct Backoff {
    deadline: tokio::time::Instant,
    pause: Duration,
}

impl Backoff {
    fn new(timeout: Duration) -> Backoff {
        Backoff { deadline: tokio::time::Instant::now() + timeout * 3, pause: Duration::from_millis(100) }
    }

    /// Waits before the next try: `false`, at once, if that pause would end past the
    /// deadline.
    async fn wait(&mut self) -> bool {
        if tokio::time::Instant::now() + self.pause > self.deadline {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
        true
    }
}

async fn open_stream(context: &jetstream::Context, options: &Options) -> Result<stream::Stream> {
    // A cluster that is still electing a leader, or placing an account's first stream,
    // can leave a request unanswered: looking the stream up and creating it are both
    // safe to repeat (a create of a stream that exists with the same configuration
    // answers with it), so they are tried again (`Backoff`).
    let mut backoff = Backoff::new(options.timeout);
    let stream = loop {
        let transient = match context.get_stream(&options.stream).await {
            Ok(s) => break s,
            Err(e) if is_stream_not_found(&e) => {
                if !options.create {
                    return Err(Error::StreamNotFound(options.stream.clone()));
                }
                match context.create_stream(stream_config(options)).await {
                    Ok(s) => break s,
                    Err(e) if create_is_transient(&e) => refused_or(e, Error::Other),
                    Err(e) => return Err(refused_or(e, Error::Other)),
                }
            }
            Err(e) if get_is_transient(&e) => refused_or(e, Error::Other),
            Err(e) => return Err(refused_or(e, Error::Other)),
        };
        if matches!(transient, Error::Refused(_)) || !backoff.wait().await {
            return Err(transient);
        }
    };
    // The lookup's or the creation's answer: no third request to fail.
    let config = &stream.cached_info().config;
    let want = stream_config(options);
    let mismatch = |what: &str| Error::StreamMismatch { stream: options.stream.clone(), what: what.into() };
    let mut subjects = config.subjects.clone();
    subjects.sort();
    let mut wanted = want.subjects.clone();
    wanted.sort();
    if subjects != wanted {
        return Err(mismatch(&format!("subjects {subjects:?}, not {wanted:?}")));
    }
    if config.storage != stream::StorageType::File {
        return Err(mismatch("its storage is not on file"));
    }
    if !config.deny_delete || !config.deny_purge {
        return Err(mismatch("it allows deleting or purging messages"));
    }
    Ok(stream)
}

/// Whether a failed stream lookup may succeed when repeated: no answer in time, or a
/// cluster that says it cannot serve the request yet.
fn get_is_transient(e: &jetstream::context::GetStreamError) -> bool {
    use jetstream::context::GetStreamErrorKind as K;
    match e.kind() {
        K::Request => true,
        K::JetStream(j) => j.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE || j.code() == 503,
        _ => false,
    }
}

/// Whether a failed stream creation may succeed when repeated (see [`get_is_transient`]).
fn create_is_transient(e: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::context::CreateStreamErrorKind as K;
    match e.kind() {
        K::TimedOut | K::JetStreamUnavailable => true,
        K::JetStream(j) => j.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE || j.code() == 503,
        _ => false,
    }
}

fn is_stream_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod url_tests {
    use super::*;

    /// No error message and no `Debug` of the options carries a password, a token or an
    /// NKey seed: a bad escape in the password, or a typo beside a token, quotes the URL
    /// masked.
    #[test]
    fn secrets_stay_out_of_errors_and_debug_output() {
        for url in [
            "tls://annal:s3cr%3t@h1:4222/S",
            "tls://annal:s3cr%zzt@h1:4222/S",
            "tls://annal:s3cret@h1:4222/S?tokn=x",
            "tls://h1:4222/S?token=s3cret&tokn=x",
            "tls://h1:4222/S?token=s3cr%et",
        ] {
            let e = Options::from_url(url).unwrap_err().to_string();
            assert!(!e.contains("s3cr"), "{url}: {e}");
        }
        let o = Options::from_url("tls://annal:s3cret@h1:4222/S").unwrap();
        assert!(!format!("{o:?}").contains("s3cret"));
        let token = Options::from_url("tls://h1:4222/S?token=s3cret").unwrap();
        assert!(!format!("{token:?}").contains("s3cret"));
        assert!(!format!("{:?}", Credentials::NKey("SUs3cret".into())).contains("s3cret"));
        assert_eq!(redact_url("tls://a:b@h:1/S?token=t&ca=/x"), "tls://a:***@h:1/S?token=***&ca=/x");
    }

    #[test]
    fn a_url_gives_servers_credentials_tls_and_the_stream() {
        let o = Options::from_url("tls://an%40nal:p%3Ass@h1:4222,h2:4223/LOGS?ca=/ca.pem&cert=/c.pem&key=/k.pem&replicas=1&create=false&timeout_ms=2500").unwrap();
        assert_eq!(o.servers, vec!["tls://h1:4222".to_string(), "tls://h2:4223".to_string()]);
        assert_eq!(o.credentials, Credentials::UserPassword { user: "an@nal".into(), password: "p:ss".into() });
        assert!(o.tls.required);
        assert_eq!(o.tls.ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(o.tls.client_cert, Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem"))));
        assert_eq!((o.stream.as_str(), o.subject_prefix.as_str(), o.replicas, o.create), ("LOGS", "logs", 1, false));
        assert_eq!(o.timeout, Duration::from_millis(2500));
        let plain = Options::from_url("nats://127.0.0.1:4222?token=t").unwrap();
        assert!(!plain.tls.required);
        assert_eq!((plain.stream.as_str(), plain.credentials), ("ANNAL", Credentials::Token("t".into())));
        for bad in [
            "127.0.0.1:4222",
            "http://h:1",
            "tls://",
            "tls://h:1?bogus=1",
            "tls://h:1?cert=/c",
            "tls://u:%zz@h:1",
            "tls://a:b@:0",
            "tls://h:1,:2",
            "nats://h:port",
            "tls://h:99999",
        ] {
            assert!(Options::from_url(bad).is_err(), "{bad}");
        }
        assert!(is_url("tls://h:1") && is_url("nats://h:1") && !is_url("/tmp/annal.redb"));
    }
}
