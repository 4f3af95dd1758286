//! Exec decoding (`smolbox_core::exec`): base64 of buffered exec output
//! against memcpy and the `base64` crate, and a 1 MiB SSE exec stream decoded
//! end to end into stdout/stderr bytes against memcpy.
//!
//!   cargo bench -p smolbox-benches --bench exec
//!
//! Figures: benches/results/sse-exec.md.

use std::hint::black_box;

use base64::Engine as _;
use divan::Bencher;
use divan::counter::BytesCount;
use smolbox_core::exec::{
    ExecOutput, ExecReplyDecoder, ExecStreamDecoder, OutputAllowance, OutputEncoding, decode_b64,
};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

fn main() {
    if let Ok(which) = std::env::var("SMOLBOX_B64_PROFILE") {
        profile(&which);
        return;
    }
    divan::main();
}

/// A profile mode for instruction counts (no divan): `which` is
/// `smolbox-<len>` or `memcpy-<len>`; the operation runs
/// `SMOLBOX_B64_PROFILE_CALLS` times (default 10,000). Run it twice with
/// different counts under `valgrind --tool=callgrind` and divide the
/// difference of the totals by the difference of the counts: set-up
/// cancels, what is left is the cost of one call.
///
/// `SMOLBOX_B64_PROFILE=smolbox-4096 SMOLBOX_B64_PROFILE_CALLS=20000 valgrind --tool=callgrind target/release/deps/exec-…`
fn profile(which: &str) {
    let calls: usize = std::env::var("SMOLBOX_B64_PROFILE_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let (case, len) = which.rsplit_once('-').expect("case-len");
    let len: usize = len.parse().expect("a length");
    let input = encoded(len);
    let mut out = Vec::with_capacity(len);
    let mut dst = vec![0u8; input.len()];
    for _ in 0..calls {
        match case {
            "smolbox" => assert!(decode_b64(black_box(input.as_bytes()), &mut out)),
            "memcpy" => dst.copy_from_slice(black_box(input.as_bytes())),
            other => panic!("unknown SMOLBOX_B64_PROFILE case {other}"),
        }
        black_box(&mut out);
        black_box(&mut dst);
    }
}

const SIZES: [usize; 2] = [4 * 1024, 64 * 1024];

/// Command output of `len` bytes (text with some binary), base64-encoded.
fn encoded(len: usize) -> String {
    let raw: Vec<u8> = (0..len)
        .map(|i| {
            if i % 97 == 0 {
                0xff
            } else {
                b"hello, world\n"[i % 13]
            }
        })
        .collect();
    base64::engine::general_purpose::STANDARD.encode(raw)
}

mod base64_decode {
    use super::*;

    /// memcpy of the base64 text (the bytes the decoder reads).
    #[divan::bench(args = SIZES)]
    fn memcpy(b: Bencher<'_, '_>, len: usize) {
        let input = encoded(len);
        let mut dst = vec![0u8; input.len()];
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            dst.copy_from_slice(black_box(input.as_bytes()));
            black_box(&mut dst);
        });
    }

    /// smolbox: the `base64` crate's runtime-detected SIMD engine into a
    /// reused buffer.
    #[divan::bench(args = SIZES)]
    fn smolbox(b: Bencher<'_, '_>, len: usize) {
        let input = encoded(len);
        let mut out = Vec::with_capacity(len);
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            assert!(decode_b64(black_box(input.as_bytes()), &mut out));
            black_box(&mut out);
        });
    }

    /// The `base64` crate's scalar general-purpose engine into a reused buffer.
    #[divan::bench(args = SIZES)]
    fn base64_crate(b: Bencher<'_, '_>, len: usize) {
        let input = encoded(len);
        let mut out = Vec::with_capacity(len);
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            out.clear();
            base64::engine::general_purpose::STANDARD
                .decode_vec(black_box(input.as_bytes()), &mut out)
                .unwrap_or_else(|e| panic!("{e}"));
            black_box(&mut out);
        });
    }

    /// base64-simd 0.8, the engine smolbox used before, into a reused buffer.
    #[divan::bench(args = SIZES)]
    fn base64_simd(b: Bencher<'_, '_>, len: usize) {
        let input = encoded(len);
        let mut out = Vec::with_capacity(len);
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            out.clear();
            base64_simd::STANDARD
                .decode_append(black_box(input.as_bytes()), &mut out)
                .unwrap_or_else(|e| panic!("{e}"));
            black_box(&mut out);
        });
    }

    /// The whole buffered reply (JSON with the lossy fields, then base64),
    /// into a reused result.
    #[divan::bench(args = SIZES)]
    fn smolbox_whole_reply(b: Bencher<'_, '_>, len: usize) {
        let stdout_b64 = encoded(len);
        let body = format!(
            r#"{{"exitCode":0,"stdout":"{}","stderr":"","stdoutB64":"{stdout_b64}","stderrB64":""}}"#,
            "hello, world\\n".repeat(len / 13)
        );
        let dec = ExecReplyDecoder::new(OutputAllowance::DEFAULT);
        let mut out = ExecOutput::empty(OutputEncoding::Bytes);
        b.counter(BytesCount::new(body.len())).bench_local(|| {
            dec.decode_into(black_box(body.as_bytes()), &mut out)
                .unwrap_or_else(|e| panic!("{e}"));
            black_box(&mut out);
        });
    }
}

/// About 1 MiB of SSE exec stream as the worker frames it, ending in exit 0.
fn exec_stream() -> Vec<u8> {
    let mut out = Vec::with_capacity(1 << 20);
    let mut i = 0u32;
    while out.len() < (1 << 20) - 1024 {
        out.extend_from_slice(if i % 4 == 3 {
            b"event: stderr\n"
        } else {
            b"event: stdout\n"
        });
        for line in 0..8 {
            out.extend_from_slice(b"data: ");
            let text = format!("line {i:06}.{line} the quick brown fox jumps over the lazy dog");
            out.extend_from_slice(&text.as_bytes()[..54]);
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: \n\n");
        i += 1;
    }
    out.extend_from_slice(b"event: exit\ndata: {\"exitCode\":0}\n\n");
    out
}

mod exec_stream_1mib {
    use super::*;

    #[divan::bench]
    fn memcpy(b: Bencher<'_, '_>) {
        let input = exec_stream();
        let mut dst = vec![0u8; input.len()];
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            for (i, chunk) in black_box(&input).chunks(4096).enumerate() {
                dst[i * 4096..i * 4096 + chunk.len()].copy_from_slice(chunk);
            }
            black_box(&mut dst);
        });
    }

    /// Fed in 4 KiB pieces, drained into stdout/stderr buffers reused across runs.
    #[divan::bench]
    fn smolbox(b: Bencher<'_, '_>) {
        let input = exec_stream();
        let allowance = OutputAllowance::new(8 << 20).unwrap_or_else(|e| panic!("{e}"));
        let mut out = ExecOutput::empty(OutputEncoding::LossyUtf8);
        b.counter(BytesCount::new(input.len())).bench_local(|| {
            out.stdout.clear();
            out.stderr.clear();
            let mut d = ExecStreamDecoder::new(allowance);
            for chunk in black_box(&input).chunks(4096) {
                d.handle_input(chunk).unwrap_or_else(|e| panic!("{e}"));
                d.drain_into(&mut out).unwrap_or_else(|e| panic!("{e}"));
            }
            assert_eq!(d.finish(), Ok(0));
            black_box(&mut out);
        });
    }
}
