//! Every size the engine accepts is bounded (SPEC §7.10, §8).

use crate::error::{Error, Limit, Rejection};

/// The configurable limits. Each one has a typed error, [`Rejection::LimitExceeded`]
/// naming the [`Limit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one content object as the host sends it: a message body, an attachment,
    /// a context text, tool arguments or a result. Default 16 MiB. A stored message
    /// object adds its role, content type and attachment ids to the body (see
    /// [`Limits::message_object_bytes_max`]).
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
    /// Bytes in one page: event records, or message bodies in a transcript page. Default
    /// 64 MiB; at least [`Limits::message_object_bytes_max`], so any message fits a page.
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
    /// Bytes of a host state entry's name. Default 128.
    pub host_state_name_bytes_max: u64,
    /// Host state entries on one session, and changes in one command. Default 64.
    pub host_state_entries_max: u64,
    /// Bytes of one streamed draft (all its segments). Default 4 MiB.
    pub draft_bytes_max: u64,
    /// Bytes of the drafts of one session. Default 16 MiB.
    pub session_draft_bytes_max: u64,
    /// Bytes of every draft in the database: drafts are held in memory as well as in
    /// the file, so this bounds the memory they take. Default 64 MiB.
    pub draft_bytes_total_max: u64,
    /// Open inputs (queued, neither consumed nor cancelled) in one session's inbox.
    /// Default 1024.
    pub inbox_inputs_max: u64,
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
            host_state_name_bytes_max: 128,
            host_state_entries_max: 64,
            draft_bytes_max: 4 * MIB,
            session_draft_bytes_max: 16 * MIB,
            draft_bytes_total_max: 64 * MIB,
            inbox_inputs_max: 1024,
        }
    }
}

/// The largest value a length that a key or a content row encodes can hold: ids, label
/// keys and values are stored behind a u16 length in projection keys.
pub const KEY_COMPONENT_BYTES_MAX: u64 = u16::MAX as u64;

/// The largest stored content object a content row can hold (its length is a u32).
pub const OBJECT_BYTES_MAX: u64 = u32::MAX as u64;

impl Limits {
    /// Bytes of the largest message object a message within these limits encodes to:
    /// the body (`content_bytes_max`) plus the role tag (at most 5 bytes), the content
    /// type (a length of at most 9 bytes and `id_bytes_max`), the body's length (9), the
    /// attachment count (9) and 32 bytes per attachment id. Readers bound a message's
    /// decoding by it.
    pub fn message_object_bytes_max(&self) -> u64 {
        let overhead = 5 + 9 + 9 + 9;
        self.content_bytes_max
            .saturating_add(overhead)
            .saturating_add(self.id_bytes_max)
            .saturating_add(self.attachments_per_message_max.saturating_mul(32))
    }

    /// Checks that the storage format can represent every value these limits allow, and
    /// that they are usable; every open checks it before it touches a file.
    ///
    /// Refused with [`Error::InvalidLimits`]: a zero for a size or count that every
    /// command needs (`content_bytes_max`, `command_bytes_max`, `messages_per_command_max`,
    /// `id_bytes_max`, `page_items_max`, `page_bytes_max`, `record_bytes_max`,
    /// `batch_commands_max`); an id, label key, label value or host state name limit over
    /// [`KEY_COMPONENT_BYTES_MAX`]; a message object limit over [`OBJECT_BYTES_MAX`]; a
    /// page byte budget smaller than the largest message.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |limit: Limit, detail: String| Err(Error::InvalidLimits { limit, detail });
        for limit in [
            Limit::ContentBytes,
            Limit::CommandBytes,
            Limit::MessagesPerCommand,
            Limit::IdBytes,
            Limit::PageItems,
            Limit::PageBytes,
            Limit::RecordBytes,
            Limit::BatchCommands,
        ] {
            if self.max(limit) == 0 {
                return invalid(limit, "must be at least 1".into());
            }
        }
        for limit in [Limit::IdBytes, Limit::LabelKeyBytes, Limit::LabelValueBytes, Limit::HostStateNameBytes] {
            if self.max(limit) > KEY_COMPONENT_BYTES_MAX {
                let detail = format!(
                    "{} is over {KEY_COMPONENT_BYTES_MAX}, the largest length a projection key can encode",
                    self.max(limit)
                );
                return invalid(limit, detail);
            }
        }
        if self.message_object_bytes_max() > OBJECT_BYTES_MAX {
            let detail = format!(
                "a message within these limits encodes to {} bytes, over {OBJECT_BYTES_MAX}, the largest object a content row can hold",
                self.message_object_bytes_max()
            );
            return invalid(Limit::ContentBytes, detail);
        }
        if self.page_bytes_max < self.message_object_bytes_max() {
            let detail = format!(
                "{} is smaller than the largest message ({} bytes), which could never be read",
                self.page_bytes_max,
                self.message_object_bytes_max()
            );
            return invalid(Limit::PageBytes, detail);
        }
        Ok(())
    }

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
            Limit::HostStateNameBytes => self.host_state_name_bytes_max,
            Limit::HostStateEntries => self.host_state_entries_max,
            Limit::DraftBytes => self.draft_bytes_max,
            Limit::SessionDraftBytes => self.session_draft_bytes_max,
            Limit::DraftBytesTotal => self.draft_bytes_total_max,
            Limit::InboxInputs => self.inbox_inputs_max,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `Limit::ALL` names every limit once: with each field a different value (the
    /// struct literal names every field, so a new one does not compile here until it is
    /// given one), the maxima of `ALL` are every value, each once.
    #[test]
    fn every_limit_is_in_all_once() {
        let limits = Limits {
            content_bytes_max: 1,
            command_bytes_max: 2,
            messages_per_command_max: 3,
            labels_per_session_max: 4,
            label_key_bytes_max: 5,
            label_value_bytes_max: 6,
            id_bytes_max: 7,
            page_items_max: 8,
            page_bytes_max: 9,
            record_bytes_max: 10,
            metadata_bytes_max: 11,
            batch_commands_max: 12,
            attachments_per_message_max: 13,
            list_items_max: 14,
            note_bytes_max: 15,
            host_state_name_bytes_max: 16,
            host_state_entries_max: 17,
            draft_bytes_max: 18,
            session_draft_bytes_max: 19,
            draft_bytes_total_max: 20,
            inbox_inputs_max: 21,
        };
        let mut maxima: Vec<u64> = Limit::ALL.iter().map(|l| limits.max(*l)).collect();
        maxima.sort_unstable();
        assert_eq!(maxima, (1..=21).collect::<Vec<u64>>());
        let names: std::collections::BTreeSet<String> = Limit::ALL.iter().map(|l| l.to_string()).collect();
        assert_eq!(names.len(), Limit::ALL.len());
    }

    /// Every default is the value SPEC §8 gives, or for the limits it does not name, the
    /// value the field's documentation gives. The destructuring names every field, so a
    /// new limit does not compile here until its default is pinned too.
    #[test]
    fn the_defaults_are_the_documented_ones() {
        let Limits {
            content_bytes_max,
            command_bytes_max,
            messages_per_command_max,
            labels_per_session_max,
            label_key_bytes_max,
            label_value_bytes_max,
            id_bytes_max,
            page_items_max,
            page_bytes_max,
            record_bytes_max,
            metadata_bytes_max,
            batch_commands_max,
            attachments_per_message_max,
            list_items_max,
            note_bytes_max,
            host_state_name_bytes_max,
            host_state_entries_max,
            draft_bytes_max,
            session_draft_bytes_max,
            draft_bytes_total_max,
            inbox_inputs_max,
        } = Limits::default();
        // SPEC §8.
        assert_eq!(content_bytes_max, 16 << 20, "content object 16 MiB");
        assert_eq!(command_bytes_max, 64 << 20, "command 64 MiB");
        assert_eq!(messages_per_command_max, 4096, "messages per command 4096");
        assert_eq!(labels_per_session_max, 64, "labels 64 per session");
        assert_eq!(label_key_bytes_max, 128, "label key 128 B");
        assert_eq!(label_value_bytes_max, 1 << 10, "label value 1 KiB");
        assert_eq!(id_bytes_max, 256, "ids and keys 256 B");
        assert_eq!(page_items_max, 10_000, "page 10,000 items");
        assert_eq!(page_bytes_max, 64 << 20, "page 64 MiB");
        assert_eq!(record_bytes_max, 128 << 20, "decoded record 128 MiB");
        // The field documentation.
        assert_eq!(metadata_bytes_max, 64 << 10, "metadata 64 KiB");
        assert_eq!(batch_commands_max, 4096, "commands per batch 4096");
        assert_eq!(attachments_per_message_max, 64, "attachments per message 64");
        assert_eq!(list_items_max, 1024, "list items per turn 1024");
        assert_eq!(note_bytes_max, 4 << 10, "note 4 KiB");
        assert_eq!(host_state_name_bytes_max, 128, "host state name 128 B");
        assert_eq!(host_state_entries_max, 64, "host state entries 64");
        assert_eq!(draft_bytes_max, 4 << 20, "draft 4 MiB");
        assert_eq!(session_draft_bytes_max, 16 << 20, "drafts of a session 16 MiB");
        assert_eq!(draft_bytes_total_max, 64 << 20, "drafts of the database 64 MiB");
        assert_eq!(inbox_inputs_max, 1024, "open inputs per inbox 1024");
        // The defaults are usable.
        assert_eq!(Limits::default().validate(), Ok(()));
    }
}
