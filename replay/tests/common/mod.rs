//! Helpers shared by the end-to-end tests of the `annal` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the `annal` binary with `args`.
pub fn annal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_annal")).args(args).output().expect("run the annal binary")
}

/// The exit code.
pub fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

/// Standard output, lossily decoded.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error, lossily decoded.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A path as the `&str` the command line takes.
pub fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A demo database named `name` in `dir` with `sessions` top-level sessions.
pub fn demo_db_named(dir: &tempfile::TempDir, name: &str, sessions: u64) -> PathBuf {
    let db = dir.path().join(name);
    let out = annal(&["demo", "--db", p(&db), "--sessions", &sessions.to_string()]);
    assert_eq!(code(&out), 0, "demo failed: {}{}", stdout(&out), stderr(&out));
    db
}
