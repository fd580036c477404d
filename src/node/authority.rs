//! The kubelet's plugin-registration client dials a Unix socket with its path
//! as the gRPC target, so grpc-go sends the path (percent-encoded) as the
//! HTTP/2 `:authority`, which is not an authority: h2 resets every such
//! stream as malformed (hyperium/h2#442; the kubelet's CSI client sends
//! `localhost` since kubernetes#112597, its registration client still does
//! not). This module rewrites that one header field to `localhost` in the
//! bytes from the client, before h2 reads them; nothing else is changed.
//!
//! The rewrite needs no HPACK decoder: a header block is walked by its
//! representations' prefixes and string lengths, and only a literal whose
//! name is the static `:authority` (index 1) is replaced. A literal that the
//! client also put in its dynamic table is replaced only when its value is
//! surely at least as long as `localhost` (so h2's table never evicts an entry
//! the client still refers to); grpc-go's long socket paths always are.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const LOCALHOST: &[u8] = b"localhost";
/// The largest frame passed on (h2's own limit is 16 KiB unless raised).
const MAX_FRAME: usize = 1 << 20;

/// Serve `client` through a stream with the fix applied: what h2 reads and
/// writes. Returns the end for h2; the copying runs as tasks until either side closes.
pub fn fixed<S>(client: S) -> DuplexStream
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut h2_read, mut h2_write) = tokio::io::split(ours);
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut h2_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = pump(&mut client_read, &mut h2_write).await;
        let _ = h2_write.shutdown().await;
    });
    theirs
}

/// Copy the client's preface and frames, fixing HEADERS frames on the way.
async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(from: &mut R, to: &mut W) -> io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 with prior knowledge: h2 says so; pass it on as it is.
        tokio::io::copy(from, to).await?;
        return Ok(());
    }
    loop {
        let mut header = [0u8; 9];
        match from.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        if len > MAX_FRAME {
            // h2 refuses it; pass the header on and let it.
            to.write_all(&header).await?;
            tokio::io::copy(from, to).await?;
            return Ok(());
        }
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        let (kind, flags) = (header[3], header[4]);
        if kind == HEADERS && flags & END_HEADERS != 0 {
            let (flags, fixed) = fix_headers_frame(flags, &payload);
            let len = fixed.len();
            let mut head = header;
            head[..3].copy_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
            head[4] = flags;
            to.write_all(&head).await?;
            to.write_all(&fixed).await?;
        } else {
            to.write_all(&header).await?;
            to.write_all(&payload).await?;
        }
        to.flush().await?;
    }
}

/// A HEADERS frame's payload with the authority fixed (padding dropped, the
/// priority fields kept): its new flags and payload. Unchanged if malformed.
pub fn fix_headers_frame(flags: u8, payload: &[u8]) -> (u8, Vec<u8>) {
    let mut start = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let Some(&pad) = payload.first() else { return (flags, payload.to_vec()) };
        start = 1;
        end = match end.checked_sub(usize::from(pad)) {
            Some(e) if e >= start => e,
            _ => return (flags, payload.to_vec()),
        };
    }
    let priority = if flags & PRIORITY != 0 { 5 } else { 0 };
    if start + priority > end {
        return (flags, payload.to_vec());
    }
    let Some(block) = fix_block(&payload[start + priority..end]) else { return (flags, payload.to_vec()) };
    let mut out = payload[start..start + priority].to_vec();
    out.extend_from_slice(&block);
    (flags & !PADDED, out)
}

/// The header block with a path-like `:authority` replaced by `localhost`;
/// None when it needs no change (or cannot be walked).
pub fn fix_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    let mut changed = false;
    while at < block.len() {
        let first = block[at];
        let (prefix_bits, indexing) = match first {
            b if b & 0x80 != 0 => {
                let (_, next) = integer(block, at, 7)?;
                out.extend_from_slice(&block[at..next]);
                at = next;
                continue;
            }
            b if b & 0xc0 == 0x40 => (6, true),
            b if b & 0xe0 == 0x20 => {
                let (_, next) = integer(block, at, 5)?;
                out.extend_from_slice(&block[at..next]);
                at = next;
                continue;
            }
            _ => (4, false),
        };
        let (name_index, after_name_index) = integer(block, at, prefix_bits)?;
        let value_at = if name_index == 0 { string(block, after_name_index)?.1 } else { after_name_index };
        let (value, next) = string(block, value_at)?;
        if name_index == 1 && (!indexing || surely_at_least(value, LOCALHOST.len())) {
            out.extend_from_slice(&block[at..value_at]);
            out.push(LOCALHOST.len() as u8);
            out.extend_from_slice(LOCALHOST);
            changed = true;
        } else {
            out.extend_from_slice(&block[at..next]);
        }
        at = next;
    }
    changed.then_some(out)
}

/// A string literal's encoding (its Huffman flag and bytes), and where it ends.
struct Literal {
    huffman: bool,
    len: usize,
}

fn string(block: &[u8], at: usize) -> Option<(Literal, usize)> {
    let huffman = block.get(at)? & 0x80 != 0;
    let (len, start) = integer(block, at, 7)?;
    let len = usize::try_from(len).ok()?;
    let end = start.checked_add(len).filter(|e| *e <= block.len())?;
    Some((Literal { huffman, len }, end))
}

/// Whether the literal decodes to at least `n` bytes: a Huffman code is at
/// most 30 bits per byte, plus fewer than 8 bits of padding.
fn surely_at_least(value: Literal, n: usize) -> bool {
    if value.huffman { (value.len * 8).saturating_sub(7) > 30 * (n - 1) } else { value.len >= n }
}

/// An HPACK integer with an `n`-bit prefix at `at`: its value and where it ends.
fn integer(block: &[u8], at: usize, n: u32) -> Option<(u64, usize)> {
    let max = (1u64 << n) - 1;
    let mut value = u64::from(*block.get(at)?) & max;
    let mut i = at + 1;
    if value < max {
        return Some((value, i));
    }
    let mut shift = 0;
    loop {
        let b = *block.get(i)?;
        i += 1;
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some((value, i));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A literal with incremental indexing of `:authority` (plain), then
    /// `:method: POST` (static 3), then a new-name literal without indexing.
    fn block(authority: &[u8], huffman: bool) -> Vec<u8> {
        let mut b = vec![0x41, authority.len() as u8 | if huffman { 0x80 } else { 0 }];
        b.extend_from_slice(authority);
        b.push(0x83);
        b.extend_from_slice(&[0x00, 0x02, b't', b'e', 0x08]);
        b.extend_from_slice(b"trailers");
        b
    }

    #[test]
    fn a_path_as_authority_becomes_localhost() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdrafs.dev-reg.sock";
        assert_eq!(fix_block(&block(path, false)), Some(block(LOCALHOST, false)));
        // Huffman-coded, 45 bytes long: surely more than 9 characters.
        let coded = [0x55u8; 45];
        assert_eq!(fix_block(&block(&coded, true)), Some(block(LOCALHOST, false)));
    }

    #[test]
    fn a_short_or_absent_authority_is_left_alone() {
        // `localhost` itself, Huffman-coded in 7 bytes: it might decode shorter than 9.
        assert_eq!(fix_block(&block(&[0x55; 7], true)), None);
        assert_eq!(fix_block(&block(b"a.b", false)), None);
        assert_eq!(fix_block(&[0x82, 0x86, 0x84]), None, "indexed fields only");
        assert_eq!(fix_block(&[0x3f, 0xe1, 0x1f]), None, "a table size update");
    }

    #[test]
    fn an_authority_not_indexed_is_always_replaced() {
        let b = [0x01, 0x03, b'a', b'/', b'b'];
        assert_eq!(fix_block(&b), Some([&[0x01, 0x09][..], LOCALHOST].concat()));
    }

    #[test]
    fn malformed_blocks_are_passed_on_unchanged() {
        for b in [
            &[0x41, 0x7f][..],
            &[0x41, 0x05, b'a'],
            &[0xff],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ] {
            assert_eq!(fix_block(b), None, "{b:?}");
        }
        assert_eq!(fix_headers_frame(END_HEADERS | PADDED, &[200, 1, 2]), (END_HEADERS | PADDED, vec![200, 1, 2]));
    }

    #[test]
    fn padding_is_dropped_and_priority_kept() {
        let path = b"/var/lib/kubelet/plugins_registry/x.sock";
        let mut payload = vec![3];
        payload.extend_from_slice(&[0x80, 0, 0, 1, 16]);
        payload.extend_from_slice(&block(path, false));
        payload.extend_from_slice(&[0, 0, 0]);
        let (flags, fixed) = fix_headers_frame(END_HEADERS | PADDED | PRIORITY, &payload);
        assert_eq!(flags, END_HEADERS | PRIORITY);
        assert_eq!(fixed, [&[0x80, 0, 0, 1, 16][..], &block(LOCALHOST, false)].concat());
    }

    #[tokio::test]
    async fn frames_pass_through_the_pump() {
        let path = b"/var/lib/kubelet/plugins_registry/x.sock";
        let headers = block(path, false);
        let mut input = PREFACE.to_vec();
        // SETTINGS (empty), then HEADERS on stream 1, then DATA.
        input.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        input.extend_from_slice(&[0, 0, headers.len() as u8, HEADERS, END_HEADERS, 0, 0, 0, 1]);
        input.extend_from_slice(&headers);
        input.extend_from_slice(&[0, 0, 2, 0, 1, 0, 0, 0, 1, 7, 7]);
        let mut out = Vec::new();
        pump(&mut &input[..], &mut out).await.unwrap();
        let fixed = block(LOCALHOST, false);
        let mut want = PREFACE.to_vec();
        want.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0, 0, fixed.len() as u8, HEADERS, END_HEADERS, 0, 0, 0, 1]);
        want.extend_from_slice(&fixed);
        want.extend_from_slice(&[0, 0, 2, 0, 1, 0, 0, 0, 1, 7, 7]);
        assert_eq!(out, want);
    }
}
