//! The protocol buffers messages the node agent exchanges with the kubelet
//! (CSI v1 Identity and Node, the kubelet's plugin registration), encoded and
//! decoded by hand: a dozen messages of strings, booleans and string maps do
//! not need a code generator, and the decoder is small enough to fuzz.
//!
//! Decoding follows proto3: unknown fields are skipped, a missing field is its
//! default, a repeated scalar field may come packed or not; anything the wire
//! format does not allow is a [`DecodeError`].

use std::collections::BTreeMap;

/// A message that is not valid protocol buffers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the message ends inside a field")]
    Truncated,
    #[error("a varint longer than 10 bytes")]
    VarintTooLong,
    #[error("field {field} has wire type {wire}, which protocol buffers does not define or this field cannot have")]
    WireType { field: u64, wire: u64 },
    #[error("field {0} is not valid UTF-8")]
    Utf8(u64),
    #[error("field number 0")]
    FieldZero,
}

/// One field as it is on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Reads the fields of one message, in order.
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn new(message: &'a [u8]) -> Self {
        Fields { rest: message }
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for (i, byte) in self.rest.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Ok(value);
            }
        }
        Err(if self.rest.len() < 10 { DecodeError::Truncated } else { DecodeError::VarintTooLong })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = (|| {
            let key = self.varint()?;
            let (number, wire) = (key >> 3, key & 7);
            if number == 0 {
                return Err(DecodeError::FieldZero);
            }
            let value = match wire {
                0 => Value::Varint(self.varint()?),
                1 => Value::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().unwrap_or_default())),
                2 => {
                    let len = usize::try_from(self.varint()?).map_err(|_| DecodeError::Truncated)?;
                    Value::Bytes(self.take(len)?)
                }
                5 => Value::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default())),
                _ => return Err(DecodeError::WireType { field: number, wire }),
            };
            Ok((number, value))
        })();
        if field.is_err() {
            // Nothing after a malformed field can be read.
            self.rest = &[];
        }
        Some(field)
    }
}

fn string(field: u64, value: Value<'_>) -> Result<String, DecodeError> {
    match value {
        Value::Bytes(b) => String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Utf8(field)),
        Value::Varint(_) => Err(DecodeError::WireType { field, wire: 0 }),
        Value::Fixed64(_) => Err(DecodeError::WireType { field, wire: 1 }),
        Value::Fixed32(_) => Err(DecodeError::WireType { field, wire: 5 }),
    }
}

fn bytes(field: u64, value: Value<'_>) -> Result<&[u8], DecodeError> {
    match value {
        Value::Bytes(b) => Ok(b),
        _ => Err(DecodeError::WireType { field, wire: wire_of(value) }),
    }
}

fn boolean(field: u64, value: Value<'_>) -> Result<bool, DecodeError> {
    match value {
        Value::Varint(v) => Ok(v != 0),
        _ => Err(DecodeError::WireType { field, wire: wire_of(value) }),
    }
}

fn wire_of(value: Value<'_>) -> u64 {
    match value {
        Value::Varint(_) => 0,
        Value::Fixed64(_) => 1,
        Value::Bytes(_) => 2,
        Value::Fixed32(_) => 5,
    }
}

/// One `map<string, string>` entry into `map` (a later key wins, as in proto3).
fn map_entry(field: u64, value: Value<'_>, map: &mut BTreeMap<String, String>) -> Result<(), DecodeError> {
    let (mut key, mut val) = (String::new(), String::new());
    for entry in Fields::new(bytes(field, value)?) {
        match entry? {
            (1, v) => key = string(field, v)?,
            (2, v) => val = string(field, v)?,
            _ => {}
        }
    }
    map.insert(key, val);
    Ok(())
}

/// Writes one message.
#[derive(Debug, Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer::default()
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }

    /// A length-delimited field (strings, bytes, messages), written even when empty.
    pub fn bytes(&mut self, field: u64, value: &[u8]) -> &mut Self {
        self.varint(field << 3 | 2);
        self.varint(value.len() as u64);
        self.out.extend_from_slice(value);
        self
    }

    /// A string field; proto3 leaves out an empty one.
    pub fn string(&mut self, field: u64, value: &str) -> &mut Self {
        if !value.is_empty() {
            self.bytes(field, value.as_bytes());
        }
        self
    }

    /// A bool field; proto3 leaves out `false`.
    pub fn boolean(&mut self, field: u64, value: bool) -> &mut Self {
        if value {
            self.varint(field << 3);
            self.varint(1);
        }
        self
    }

    /// An int64 field; proto3 leaves out 0.
    pub fn int64(&mut self, field: u64, value: i64) -> &mut Self {
        if value != 0 {
            self.varint(field << 3);
            self.varint(value as u64);
        }
        self
    }

    pub fn message(&mut self, field: u64, message: Writer) -> &mut Self {
        self.bytes(field, &message.out)
    }

    pub fn map(&mut self, field: u64, map: &BTreeMap<String, String>) -> &mut Self {
        for (k, v) in map {
            let mut entry = Writer::new();
            entry.string(1, k).string(2, v);
            self.message(field, entry);
        }
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

/// `csi.v1.NodePublishVolumeRequest`, the fields drafs reads.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NodePublishVolumeRequest {
    pub volume_id: String,
    pub target_path: String,
    pub readonly: bool,
    /// Whether `volume_capability` asked for a block device (drafs serves a filesystem only).
    pub block: bool,
    /// `volume_capability.mount.mount_flags`: for an inline volume, only the
    /// kubelet's SELinux `context=` (CSIDriver `seLinuxMount: true`).
    pub mount_flags: Vec<String>,
    pub volume_context: BTreeMap<String, String>,
    /// Where the kubelet puts the pod's tokens when the CSIDriver asks for
    /// them there (`serviceAccountTokenInSecrets`, KEP-5538). Never printed.
    pub secrets: BTreeMap<String, String>,
}

impl std::fmt::Debug for NodePublishVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("target_path", &self.target_path)
            .field("readonly", &self.readonly)
            .field("block", &self.block)
            .field("mount_flags", &self.mount_flags)
            .field("volume_context", &self.volume_context.keys().collect::<Vec<_>>())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl NodePublishVolumeRequest {
    pub fn decode(message: &[u8]) -> Result<Self, DecodeError> {
        let mut req = NodePublishVolumeRequest::default();
        for field in Fields::new(message) {
            match field? {
                (1, v) => req.volume_id = string(1, v)?,
                (4, v) => req.target_path = string(4, v)?,
                (5, v) => {
                    // VolumeCapability: oneof access_type { block = 1; mount = 2; },
                    // MountVolume { fs_type = 1; repeated mount_flags = 2; }
                    for cap in Fields::new(bytes(5, v)?) {
                        match cap? {
                            (1, _) => req.block = true,
                            (2, mount) => {
                                for flag in Fields::new(bytes(2, mount)?) {
                                    if let (2, flag) = flag? {
                                        req.mount_flags.push(string(2, flag)?);
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                (6, v) => req.readonly = boolean(6, v)?,
                (7, v) => map_entry(7, v, &mut req.secrets)?,
                (8, v) => map_entry(8, v, &mut req.volume_context)?,
                _ => {}
            }
        }
        Ok(req)
    }
}

/// `csi.v1.NodeUnpublishVolumeRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeUnpublishVolumeRequest {
    pub volume_id: String,
    pub target_path: String,
}

impl NodeUnpublishVolumeRequest {
    pub fn decode(message: &[u8]) -> Result<Self, DecodeError> {
        let mut req = NodeUnpublishVolumeRequest::default();
        for field in Fields::new(message) {
            match field? {
                (1, v) => req.volume_id = string(1, v)?,
                (2, v) => req.target_path = string(2, v)?,
                _ => {}
            }
        }
        Ok(req)
    }
}

/// `pluginregistration.RegistrationStatus`: the kubelet's answer to a registration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationStatus {
    pub plugin_registered: bool,
    pub error: String,
}

impl RegistrationStatus {
    pub fn decode(message: &[u8]) -> Result<Self, DecodeError> {
        let mut status = RegistrationStatus::default();
        for field in Fields::new(message) {
            match field? {
                (1, v) => status.plugin_registered = boolean(1, v)?,
                (2, v) => status.error = string(2, v)?,
                _ => {}
            }
        }
        Ok(status)
    }
}

/// A message whose fields drafs does not read: checked to be well-formed only.
pub fn check(message: &[u8]) -> Result<(), DecodeError> {
    Fields::new(message).try_for_each(|f| f.map(drop))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish_request() -> Vec<u8> {
        let mut mount = Writer::new();
        mount.string(1, "tmpfs").string(2, "context=\"system_u:object_r:container_file_t:s0:c1,c2\"");
        let mut capability = Writer::new();
        capability.message(2, mount);
        let mut access = Writer::new();
        access.int64(1, 1);
        capability.message(3, access);
        let context: BTreeMap<String, String> = [
            ("csi.storage.k8s.io/pod.name".to_string(), "app".to_string()),
            ("csi.storage.k8s.io/ephemeral".to_string(), "true".to_string()),
            ("empty".to_string(), String::new()),
        ]
        .into();
        let mut w = Writer::new();
        w.string(1, "csi-0123")
            .string(4, "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/dra/mount")
            .message(5, capability)
            .boolean(6, true)
            .map(8, &context)
            .string(99, "a field from a later CSI version");
        w.finish()
    }

    #[test]
    fn a_publish_request_is_read() {
        let req = NodePublishVolumeRequest::decode(&publish_request()).unwrap();
        assert_eq!(req.volume_id, "csi-0123");
        assert_eq!(req.target_path, "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/dra/mount");
        assert!(req.readonly);
        assert!(!req.block);
        assert_eq!(req.mount_flags, ["context=\"system_u:object_r:container_file_t:s0:c1,c2\""]);
        assert_eq!(req.volume_context["csi.storage.k8s.io/pod.name"], "app");
        assert_eq!(req.volume_context["empty"], "", "an entry without a value has the empty string");
        assert_eq!(req.volume_context.len(), 3);
    }

    #[test]
    fn a_block_volume_is_told_apart() {
        let mut capability = Writer::new();
        capability.message(1, Writer::new());
        let mut w = Writer::new();
        w.message(5, capability);
        assert!(NodePublishVolumeRequest::decode(&w.finish()).unwrap().block);
    }

    #[test]
    fn every_truncation_of_a_request_is_an_error_or_a_prefix_not_a_panic() {
        let full = publish_request();
        for n in 0..full.len() {
            // Some prefixes end between fields and are valid messages.
            let _ = NodePublishVolumeRequest::decode(&full[..n]);
        }
        assert_eq!(NodePublishVolumeRequest::decode(&full[..full.len() - 1]), Err(DecodeError::Truncated));
    }

    #[test]
    fn malformed_messages_are_errors() {
        // Field 1 as a varint where a string belongs.
        assert_eq!(NodeUnpublishVolumeRequest::decode(&[0x08, 0x01]), Err(DecodeError::WireType { field: 1, wire: 0 }));
        // Wire types 3 and 4 (groups) and 6, 7 are not accepted.
        assert!(matches!(check(&[0x0b]), Err(DecodeError::WireType { wire: 3, .. })));
        assert!(matches!(check(&[0x0e]), Err(DecodeError::WireType { wire: 6, .. })));
        assert_eq!(check(&[0x00]), Err(DecodeError::FieldZero));
        assert_eq!(check(&[0xff; 11]), Err(DecodeError::VarintTooLong));
        assert_eq!(check(&[0x0a, 0x05, b'a']), Err(DecodeError::Truncated));
        // A length that does not fit in memory.
        assert_eq!(
            check(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(NodeUnpublishVolumeRequest::decode(&[0x0a, 0x01, 0xff]), Err(DecodeError::Utf8(1)));
    }

    #[test]
    fn fields_round_trip() {
        let mut w = Writer::new();
        w.string(1, "name").boolean(2, true).boolean(3, false).int64(4, 300).int64(5, -1).string(6, "");
        let out = w.finish();
        let fields: Vec<_> = Fields::new(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            fields,
            vec![
                (1, Value::Bytes(b"name")),
                (2, Value::Varint(1)),
                (4, Value::Varint(300)),
                (5, Value::Varint(u64::MAX)),
            ]
        );
        let status = RegistrationStatus::decode(&{
            let mut w = Writer::new();
            w.boolean(1, true).string(2, "no");
            w.finish()
        })
        .unwrap();
        assert_eq!(status, RegistrationStatus { plugin_registered: true, error: "no".into() });
    }
}
