//! Engine errors as Python exceptions: the class of `annal.errors` named like the Rust
//! variant, with the variant's fields as attributes.

use annal::{Error, Location, Rejection};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::BoundObject;

type Fields<'py> = Vec<(&'static str, Bound<'py, PyAny>)>;

fn v<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> Bound<'py, PyAny> {
    match value.into_pyobject(py) {
        Ok(obj) => obj.into_bound().into_any(),
        Err(_) => py.None().into_bound(py),
    }
}

fn rejection<'py>(py: Python<'py>, r: &Rejection) -> (&'static str, Fields<'py>) {
    use Rejection as R;
    match r {
        R::NotFound { session } => ("NotFound", vec![("session", v(py, session.to_string()))]),
        R::AlreadyExists { session } => ("AlreadyExists", vec![("session", v(py, session.to_string()))]),
        R::Archived { session } => ("Archived", vec![("session", v(py, session.to_string()))]),
        R::NotArchived { session } => ("NotArchived", vec![("session", v(py, session.to_string()))]),
        R::RevisionConflict { expected, actual } => {
            ("RevisionConflict", vec![("expected", v(py, expected.to_hex())), ("actual", v(py, actual.to_hex()))])
        }
        R::VersionConflict { expected, actual } => {
            ("VersionConflict", vec![("expected", v(py, *expected)), ("actual", v(py, *actual))])
        }
        R::Busy { holder, expires_at_ms } => {
            ("Busy", vec![("holder", v(py, holder.clone())), ("expires_at_ms", v(py, *expires_at_ms))])
        }
        R::Fenced { presented, current } => {
            ("Fenced", vec![("presented", v(py, *presented)), ("current", v(py, *current))])
        }
        R::InputConflict { input_id } => ("InputConflict", vec![("input_id", v(py, input_id.clone()))]),
        R::UnknownInput { input_id } => ("UnknownInput", vec![("input_id", v(py, input_id.clone()))]),
        R::InputState { input_id, state } => {
            ("InputState", vec![("input_id", v(py, input_id.clone())), ("state", v(py, *state))])
        }
        R::UnknownClaim { claim } => ("UnknownClaim", vec![("claim", v(py, *claim))]),
        R::TurnNotLive { turn_id } => ("TurnNotLive", vec![("turn_id", v(py, turn_id.clone()))]),
        R::NotIdle { turn_id } => ("NotIdle", vec![("turn_id", v(py, turn_id.clone()))]),
        R::TurnConflict { turn_id } => ("TurnConflict", vec![("turn_id", v(py, turn_id.clone()))]),
        R::ContextNotPending { key } => ("ContextNotPending", vec![("key", v(py, key.clone()))]),
        R::ContextConflict { key } => ("ContextConflict", vec![("key", v(py, key.clone()))]),
        R::InvalidRequest { reason } => ("InvalidRequest", vec![("reason", v(py, reason.clone()))]),
        R::LimitExceeded { limit, actual, max } => (
            "LimitExceeded",
            vec![("limit", v(py, limit.to_string())), ("actual", v(py, *actual)), ("max", v(py, *max))],
        ),
        R::InvalidRange { start, end, len } => {
            ("InvalidRange", vec![("start", v(py, *start)), ("end", v(py, *end)), ("len", v(py, *len))])
        }
        R::NoChange => ("NoChange", vec![]),
        R::UnknownRevision { revision } => ("UnknownRevision", vec![("revision", v(py, revision.to_hex()))]),
        R::IndexOutOfBounds { index, len } => {
            ("IndexOutOfBounds", vec![("index", v(py, *index)), ("len", v(py, *len))])
        }
        R::ToolConflict { op_id, field } => {
            ("ToolConflict", vec![("op_id", v(py, op_id.clone())), ("field", v(py, *field))])
        }
        R::ToolOrphan { op_id } => ("ToolOrphan", vec![("op_id", v(py, op_id.clone()))]),
        R::UnknownToolOp { op_id } => ("UnknownToolOp", vec![("op_id", v(py, op_id.clone()))]),
        R::InvalidImport { seq, reason } => {
            ("InvalidImport", vec![("seq", v(py, *seq)), ("reason", v(py, reason.clone()))])
        }
        R::SessionConflict { session } => ("SessionConflict", vec![("session", v(py, session.to_string()))]),
        R::ForkParentMissing { session, parent } => {
            ("ForkParentMissing", vec![("session", v(py, session.to_string())), ("parent", v(py, parent.to_string()))])
        }
        R::ForkParentMoved { session, parent } => {
            ("ForkParentMoved", vec![("session", v(py, session.to_string())), ("parent", v(py, parent.to_string()))])
        }
        R::Purged { session, seq } => ("Purged", vec![("session", v(py, session.to_string())), ("seq", v(py, *seq))]),
        R::HasForks { session, forks } => (
            "HasForks",
            vec![
                ("session", v(py, session.to_string())),
                ("forks", v(py, forks.iter().map(|f| f.to_string()).collect::<Vec<_>>())),
            ],
        ),
        R::Batch { index, rejection: inner } => {
            let inner_err = build(py, "Batch", &inner.to_string(), rejection(py, inner));
            ("Batch", vec![("index", v(py, *index)), ("rejection", inner_err)])
        }
    }
}

fn location(l: &Location) -> String {
    l.to_string()
}

fn error<'py>(py: Python<'py>, e: &Error) -> (&'static str, Fields<'py>) {
    match e {
        Error::Rejected(r) => rejection(py, r),
        Error::OversizedRecord { seq, size, max_bytes } => {
            ("OversizedRecord", vec![("seq", v(py, *seq)), ("size", v(py, *size)), ("max_bytes", v(py, *max_bytes))])
        }
        Error::OversizedMessage { position, size, max_bytes } => (
            "OversizedMessage",
            vec![("position", v(py, *position)), ("size", v(py, *size)), ("max_bytes", v(py, *max_bytes))],
        ),
        Error::InvalidLimits { limit, detail } => {
            ("InvalidLimits", vec![("limit", v(py, limit.to_string())), ("detail", v(py, detail.clone()))])
        }
        Error::Corrupt { location: l, detail } => {
            ("Corrupt", vec![("location", v(py, location(l))), ("detail", v(py, detail.clone()))])
        }
        Error::Decode { seq, source } => ("Decode", vec![("seq", v(py, *seq)), ("detail", v(py, source.to_string()))]),
        Error::UnsupportedFormat { found, supported } => {
            ("UnsupportedFormat", vec![("found", v(py, *found)), ("supported", v(py, *supported))])
        }
        Error::MigrationRequired { found, supported } => {
            ("MigrationRequired", vec![("found", v(py, *found)), ("supported", v(py, *supported))])
        }
        Error::KeyMismatch { detail } => ("KeyMismatch", vec![("detail", v(py, detail.clone()))]),
        Error::Poisoned => ("Poisoned", vec![]),
        Error::Closed => ("Closed", vec![]),
        Error::Storage(failure) => (
            "Storage",
            vec![
                ("detail", v(py, failure.detail().to_string())),
                ("kind", v(py, failure.io_kind().map(|k| format!("{k:?}")))),
            ],
        ),
        Error::Backend(e) => ("Backend", vec![("detail", v(py, e.to_string()))]),
    }
}

/// Instantiates `annal.errors.<name>(message, **fields)`.
fn build<'py>(
    py: Python<'py>,
    _family: &str,
    message: &str,
    (name, fields): (&'static str, Fields<'py>),
) -> Bound<'py, PyAny> {
    let attempt = || -> PyResult<Bound<'py, PyAny>> {
        let module = py.import("annal.errors")?;
        let class = module.getattr(name)?;
        let kwargs = PyDict::new(py);
        for (k, value) in fields {
            kwargs.set_item(k, value)?;
        }
        class.call((message,), Some(&kwargs))
    };
    match attempt() {
        Ok(e) => e,
        Err(e) => e.into_value(py).into_any().into_bound(py),
    }
}

/// The Python exception for an engine error.
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let message = e.to_string();
    let obj = build(py, "Error", &message, error(py, &e));
    PyErr::from_value(obj)
}
