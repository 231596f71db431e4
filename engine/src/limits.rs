//! Every size the engine accepts is bounded (SPEC §7.10, §8).

use crate::error::{Limit, Rejection};

/// The configurable limits. Each one has a typed error, [`Rejection::LimitExceeded`]
/// naming the [`Limit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one content object. Default 16 MiB.
    pub content_bytes_max: u64,
    /// Bytes of one command. Default 64 MiB.
    pub command_bytes_max: u64,
    /// Messages in one command. Default 4096.
    pub messages_per_command_max: u64,
    /// Labels on one session. Default 64.
    pub labels_per_session_max: u64,
    /// Bytes of a label key. Default 128.
    pub label_key_bytes_max: u64,
    /// Bytes of a label value. Default 1 KiB.
    pub label_value_bytes_max: u64,
    /// Bytes of an id or key (turn id, op id, context key, run id, ...). Default 256.
    pub id_bytes_max: u64,
    /// Items in one page. Default 10,000.
    pub page_items_max: u64,
    /// Bytes in one page. Default 64 MiB.
    pub page_bytes_max: u64,
    /// Bytes of one decoded record. Default 128 MiB.
    pub record_bytes_max: u64,
    /// Bytes of session metadata. Default 64 KiB.
    pub metadata_bytes_max: u64,
    /// Commands in one batch. Default 4096.
    pub batch_commands_max: u64,
    /// Attachments on one message. Default 64.
    pub attachments_per_message_max: u64,
    /// Usage entries, context keys or tool references in one turn. Default 1024.
    pub list_items_max: u64,
    /// Bytes of a free-form note, reason, actor or source. Default 4 KiB.
    pub note_bytes_max: u64,
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            content_bytes_max: 16 * MIB,
            command_bytes_max: 64 * MIB,
            messages_per_command_max: 4096,
            labels_per_session_max: 64,
            label_key_bytes_max: 128,
            label_value_bytes_max: KIB,
            id_bytes_max: 256,
            page_items_max: 10_000,
            page_bytes_max: 64 * MIB,
            record_bytes_max: 128 * MIB,
            metadata_bytes_max: 64 * KIB,
            batch_commands_max: 4096,
            attachments_per_message_max: 64,
            list_items_max: 1024,
            note_bytes_max: 4 * KIB,
        }
    }
}

impl Limits {
    /// The maximum for `limit`.
    pub fn max(&self, limit: Limit) -> u64 {
        match limit {
            Limit::ContentBytes => self.content_bytes_max,
            Limit::CommandBytes => self.command_bytes_max,
            Limit::MessagesPerCommand => self.messages_per_command_max,
            Limit::LabelsPerSession => self.labels_per_session_max,
            Limit::LabelKeyBytes => self.label_key_bytes_max,
            Limit::LabelValueBytes => self.label_value_bytes_max,
            Limit::IdBytes => self.id_bytes_max,
            Limit::PageItems => self.page_items_max,
            Limit::PageBytes => self.page_bytes_max,
            Limit::RecordBytes => self.record_bytes_max,
            Limit::MetadataBytes => self.metadata_bytes_max,
            Limit::BatchCommands => self.batch_commands_max,
            Limit::AttachmentsPerMessage => self.attachments_per_message_max,
            Limit::ListItems => self.list_items_max,
            Limit::NoteBytes => self.note_bytes_max,
        }
    }

    /// `Ok` when `actual <= max(limit)`, else the typed rejection.
    pub fn check(&self, limit: Limit, actual: u64) -> Result<(), Rejection> {
        let max = self.max(limit);
        if actual > max {
            return Err(Rejection::LimitExceeded { limit, actual, max });
        }
        Ok(())
    }

    /// Checks an id or key: 1 to `id_bytes_max` bytes of UTF-8 (UTF-8 is given by `&str`).
    pub fn check_id(&self, what: &str, id: &str) -> Result<(), Rejection> {
        if id.is_empty() {
            return Err(Rejection::InvalidRequest { reason: format!("{what} must not be empty") });
        }
        self.check(Limit::IdBytes, id.len() as u64)
    }
}
