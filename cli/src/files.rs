//! `cp`: upload `LOCAL MACHINE:/path`, download `MACHINE:/path LOCAL`,
//! with a progress bar on stderr (hidden when stderr is not a terminal)
//! and the SHA-256 computed and checked. A download is checked before it
//! is written, then written to a temporary file beside the target and
//! renamed over it.

use smolbox_core::Reason;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use sha2::{Digest, Sha256};
use smolbox_core::worker::{Download, FileBudget, GuestPath, MachineName, PathPolicy, Upload};
use smolbox_core::{Error, Operation};

use crate::args::CpArgs;
use crate::backend::Backend;
use crate::report::{self, Failure};

const CHUNK: usize = 64 * 1024;

/// `MACHINE:/path`, when `arg` has that shape.
fn remote(arg: &str) -> Option<(&str, &str)> {
    let (machine, path) = arg.split_once(':')?;
    let ok = !machine.is_empty()
        && path.starts_with('/')
        && machine
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_');
    ok.then_some((machine, path))
}

/// `cp SRC DST`; `MACHINE` is a managed machine's id (its placed worker
/// name is used, once its recorded incarnation is verified on the worker)
/// or a worker's machine name.
pub(crate) fn cp(
    ctx: &crate::machines::Ctx<'_>,
    args: &CpArgs,
    json: bool,
) -> Result<i32, Failure> {
    let b = ctx.backend;
    let expected = match &args.sha256 {
        Some(h) => Some(parse_hex(h)?),
        None => None,
    };
    let placed = |m: &str| crate::machines::verified_worker_name(ctx, m);
    match (remote(&args.src), remote(&args.dst)) {
        (None, Some((shown, path))) => {
            let machine = placed(shown)?;
            upload(
                b,
                Path::new(&args.src),
                (&machine, shown),
                path,
                args,
                expected,
                json,
            )
        }
        (Some((shown, path)), None) => {
            let machine = placed(shown)?;
            download(
                b,
                (&machine, shown),
                path,
                Path::new(&args.dst),
                args,
                expected,
                json,
            )
        }
        _ => Err(Error::validation(Operation::GuestPath, Reason::CpNeedsOneLocalOneRemote).into()),
    }
}

fn parse_hex(h: &str) -> Result<String, Failure> {
    let lower = h.to_ascii_lowercase();
    if lower.len() == 64 && lower.bytes().all(|c| c.is_ascii_hexdigit()) {
        Ok(lower)
    } else {
        Err(Error::validation(Operation::Upload, Reason::InvalidSha256).into())
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn bar(len: u64, message: &'static str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>10} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
}

/// A byte count with its rate, for a transfer of unknown size.
fn counter(message: &'static str) -> ProgressBar {
    let counter = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{msg:>10} {bytes} {bytes_per_sec} {elapsed}") {
        counter.set_style(style);
    }
    counter.set_message(message);
    counter
}

fn budget(b: &Backend, max_bytes: u64) -> Result<FileBudget, Error> {
    FileBudget::new(max_bytes, b.endpoint_budgets())
}

fn print_result(
    direction: &str,
    from: &str,
    to: &str,
    size: u64,
    digest: &str,
    json: bool,
) -> Result<(), Failure> {
    if json {
        report::line(
            &json!({"direction": direction, "from": from, "to": to, "bytes": size, "sha256": digest})
                .to_string(),
        )
    } else {
        report::line(&format!(
            "{direction} {from} -> {to}: {size} bytes, sha256 {digest}"
        ))
    }
}

#[allow(clippy::too_many_arguments)]
fn upload(
    b: &Backend,
    local: &Path,
    (machine, shown): (&str, &str),
    path: &str,
    args: &CpArgs,
    expected: Option<String>,
    json: bool,
) -> Result<i32, Failure> {
    let name = MachineName::new(machine)?;
    let guest = GuestPath::new(path)?;
    let budget = budget(b, args.max_bytes)?;
    let doing = || format!("read {}", local.display());
    let file = std::fs::File::open(local).map_err(|e| Failure::local(doing(), &e))?;
    let len = file
        .metadata()
        .map_err(|e| Failure::local(doing(), &e))?
        .len();
    if len > budget.allowance() {
        return Err(
            Error::validation(Operation::Upload, Reason::FileAllowanceExceeded)
                .with_limit(len, budget.allowance())
                .into(),
        );
    }
    // Read and hash with progress; the body is sent in one request.
    let progress = bar(len, "reading");
    let mut data = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    let mut hasher = Sha256::new();
    let mut reader = file.take(budget.allowance() + 1);
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = reader
            .read(&mut chunk)
            .map_err(|e| Failure::local(doing(), &e))?;
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
        data.extend_from_slice(&chunk[..n]);
        progress.inc(n as u64);
    }
    let digest = hex(&hasher.finalize());
    if let Some(want) = expected
        && want != digest
    {
        progress.abandon();
        return Err(Error::validation(Operation::Upload, Reason::Sha256Mismatch).into());
    }
    progress.finish_and_clear();
    let profile = b.admit()?;
    let size = data.len() as u64;
    // The core re-checks the digest over the exact bytes it sends.
    let call = Upload::new(
        &profile,
        &PathPolicy::default(),
        &budget,
        name,
        guest,
        Bytes::from(data),
        &digest,
    )?;
    // The bytes the socket took, as the client counts them.
    let sending = bar(size, "uploading");
    let reply = b.upload_with_progress(&call, &mut |sent| sending.set_position(sent));
    sending.finish_and_clear();
    let reply = reply?;
    print_result(
        "uploaded",
        &local.display().to_string(),
        &format!("{shown}:{}", reply.path),
        size,
        &digest,
        json,
    )?;
    Ok(0)
}

/// Where a download goes: `local`, or the guest file's name inside it when
/// `local` is a directory.
fn target_path(local: &Path, guest: &str) -> PathBuf {
    match (local.is_dir(), guest.rsplit('/').next()) {
        (true, Some(base)) if !base.is_empty() && base != "." && base != ".." => local.join(base),
        _ => local.to_path_buf(),
    }
}

/// Writes `data` to a temporary file in `target`'s directory, syncs it,
/// then renames it over `target`: an interrupted or failed write never
/// leaves a partial file under the target's name (nor replaces an older
/// one), and the temporary file is removed on failure.
pub(crate) fn write_then_rename(target: &Path, data: &[u8]) -> Result<(), Failure> {
    let doing = || format!("write {}", target.display());
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".smolbox-cp-")
        .suffix(".part")
        .tempfile_in(&dir)
        .map_err(|e| Failure::local(doing(), &e))?;
    let progress = bar(data.len() as u64, "writing");
    for piece in data.chunks(CHUNK) {
        tmp.write_all(piece)
            .map_err(|e| Failure::local(doing(), &e))?;
        progress.inc(piece.len() as u64);
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| Failure::local(doing(), &e))?;
    // The new file gets the usual mode for a created file (umask applied),
    // not the temporary file's 0600.
    let mode = 0o666 & !current_umask();
    let _ = tmp
        .as_file()
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode));
    tmp.persist(target)
        .map_err(|e| Failure::local(doing(), &e.error))?;
    progress.finish_and_clear();
    Ok(())
}

/// The process umask, read from `/proc/self/status` (0o022 when unknown:
/// it cannot be read without changing it elsewhere).
fn current_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

#[allow(clippy::too_many_arguments)]
fn download(
    b: &Backend,
    (machine, shown): (&str, &str),
    path: &str,
    local: &Path,
    args: &CpArgs,
    expected: Option<String>,
    json: bool,
) -> Result<i32, Failure> {
    let name = MachineName::new(machine)?;
    let guest = GuestPath::new(path)?;
    let budget = budget(b, args.max_bytes)?;
    let profile = b.admit()?;
    let call = Download::new(
        &profile,
        &PathPolicy::default(),
        &budget,
        name,
        guest,
        budget.allowance(),
    )?;
    // The bytes actually received, as they arrive (the size is not known
    // before the reply: a count, not a bar).
    let received = counter("received");
    let data = b.download_with_progress(&call, &mut |n| received.set_position(n));
    received.finish_and_clear();
    let data = data?;
    let digest = hex(&Sha256::digest(&data));
    if let Some(want) = expected
        && want != digest
    {
        // Nothing is written: the bytes are not the expected file.
        return Err(Error::validation(Operation::Download, Reason::Sha256Mismatch).into());
    }
    let target = target_path(local, path);
    write_then_rename(&target, &data)?;
    print_result(
        "downloaded",
        &format!("{shown}:{path}"),
        &target.display().to_string(),
        data.len() as u64,
        &digest,
        json,
    )?;
    Ok(0)
}
