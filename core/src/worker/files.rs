//! Guest files: path syntax and policy (features C6.2), byte budgets
//! (C6.3), upload and download (C6.1).

use crate::Reason;
use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::machines::{ImageCheck, MachineName};
use super::profile::{Feature, Profile};
use super::status::{check_media_type, status_error};
use super::{APPLICATION_JSON, APPLICATION_OCTET_STREAM, WorkerCall, machine_target};
use crate::error::{Error, Evidence, Operation};
use crate::http1::encode::push_path_segment;
use crate::http1::{Method, Request, ResponseHead};
use crate::worker::endpoint::Budgets;
use crate::worker::json::decode_json;

/// Longest guest path in bytes.
pub const MAX_GUEST_PATH_LEN: usize = 1_024;
/// Most roots in one policy list.
pub const MAX_ROOTS: usize = 32;
/// The default root of every list.
pub const DEFAULT_ROOT: &str = "/workspace";
/// Default client per-file allowance.
pub const DEFAULT_FILE_ALLOWANCE: u64 = 1_048_576;
/// Largest client per-file allowance.
pub const MAX_FILE_ALLOWANCE: u64 = 16_777_216;
/// Files above this size need the 1.17.0+ large-file feature.
pub const SMALL_FILE_MAX: u64 = 1_048_576;
/// Bytes of an error reply a download keeps for classification.
pub const ERROR_BODY_ALLOWANCE: u64 = 65_536;

/// A lexical guest path (C6.2): absolute, UTF-8, ≤1,024 bytes, no NUL,
/// `%` or `\`, no empty, `.` or `..` segments (so no repeated or trailing
/// `/`), except the root `/` itself. No `~` or variable expansion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuestPath(Box<str>);

impl GuestPath {
    /// Validates a guest path.
    ///
    /// # Errors
    /// `validation`, operation `guest_path`, reason `invalid_guest_path`.
    pub fn new(path: &str) -> Result<Self, Error> {
        let ok = path.len() <= MAX_GUEST_PATH_LEN
            && path.starts_with('/')
            && !path.contains(['\0', '%', '\\'])
            && (path == "/"
                || path[1..]
                    .split('/')
                    .all(|s| !s.is_empty() && s != "." && s != ".."));
        if ok {
            Ok(Self(path.into()))
        } else {
            Err(Error::validation(
                Operation::GuestPath,
                Reason::InvalidGuestPath,
            ))
        }
    }

    /// The path text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `self` (a root) covers `path` by whole segments: `/app`
    /// covers `/app` and `/app/x`, not `/application`; `/` covers all.
    pub fn covers(&self, path: &Self) -> bool {
        &*self.0 == "/"
            || path.0 == self.0
            || path
                .0
                .strip_prefix(&*self.0)
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The percent-encoded target suffix: leading `/` dropped, each segment
    /// encoded keeping only RFC 3986 unreserved characters (C6.1).
    pub fn encoded(&self) -> String {
        let mut out = String::with_capacity(self.0.len() * 3);
        for (i, seg) in self.0[1..].split('/').enumerate() {
            if i > 0 {
                out.push('/');
            }
            push_path_segment(&mut out, seg);
        }
        out
    }
}

/// The three root lists of the guest path policy (C6.2), each sorted and
/// deduplicated, ≤32 roots. Default: `["/workspace"]` for all three.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PathPolicy {
    upload: Vec<GuestPath>,
    download: Vec<GuestPath>,
    workdir: Vec<GuestPath>,
}

impl Default for PathPolicy {
    fn default() -> Self {
        let root = || vec![GuestPath(DEFAULT_ROOT.into())];
        Self {
            upload: root(),
            download: root(),
            workdir: root(),
        }
    }
}

impl PathPolicy {
    /// Builds a policy. An empty upload or download list denies that
    /// direction; the working-directory list must be non-empty.
    ///
    /// # Errors
    /// `validation`, operation `guest_path`.
    pub fn new(
        upload: Vec<GuestPath>,
        download: Vec<GuestPath>,
        workdir: Vec<GuestPath>,
    ) -> Result<Self, Error> {
        let canon = |mut v: Vec<GuestPath>| {
            if v.len() > MAX_ROOTS {
                return Err(
                    Error::validation(Operation::GuestPath, Reason::TooManyRoots)
                        .with_limit(v.len() as u64, MAX_ROOTS as u64),
                );
            }
            v.sort();
            v.dedup();
            Ok(v)
        };
        let workdir = canon(workdir)?;
        if workdir.is_empty() {
            return Err(Error::validation(
                Operation::GuestPath,
                Reason::EmptyWorkdirRoots,
            ));
        }
        Ok(Self {
            upload: canon(upload)?,
            download: canon(download)?,
            workdir,
        })
    }

    /// Upload roots.
    pub fn upload_roots(&self) -> &[GuestPath] {
        &self.upload
    }

    /// Download roots.
    pub fn download_roots(&self) -> &[GuestPath] {
        &self.download
    }

    /// Working-directory roots.
    pub fn workdir_roots(&self) -> &[GuestPath] {
        &self.workdir
    }

    /// True when `path` may be uploaded (`/` is never a file target).
    pub fn allows_upload(&self, path: &GuestPath) -> bool {
        path.as_str() != "/" && self.upload.iter().any(|r| r.covers(path))
    }

    /// True when `path` may be downloaded (`/` is never a file target).
    pub fn allows_download(&self, path: &GuestPath) -> bool {
        path.as_str() != "/" && self.download.iter().any(|r| r.covers(path))
    }

    /// True when `path` may be a working directory.
    pub fn allows_workdir(&self, path: &GuestPath) -> bool {
        self.workdir.iter().any(|r| r.covers(path))
    }

    /// True when every root of `other` is covered by a root of `self` in
    /// the same list (a client policy must be a superset of a profile's).
    pub fn is_superset_of(&self, other: &Self) -> bool {
        let sup = |mine: &[GuestPath], theirs: &[GuestPath]| {
            theirs.iter().all(|t| mine.iter().any(|m| m.covers(t)))
        };
        sup(&self.upload, &other.upload)
            && sup(&self.download, &other.download)
            && sup(&self.workdir, &other.workdir)
    }
}

fn outside_default_root(path: &GuestPath) -> bool {
    !GuestPath(DEFAULT_ROOT.into()).covers(path)
}

/// True when a transfer of up to `bytes` at `path` needs a plain image
/// machine (C6.1): over [`SMALL_FILE_MAX`] or outside `/workspace`. Such
/// an [`Upload`] or [`Download`] carries an [`ImageCheck`]; the managed
/// runtime asks the same question of a slot command's declared files
/// before accepting it.
pub fn needs_image_machine(bytes: u64, path: &GuestPath) -> bool {
    bytes > SMALL_FILE_MAX || outside_default_root(path)
}

/// The byte budgets a transfer runs under (C6.3): the client's per-file
/// allowance (1 B–16 MiB, default 1 MiB) and the endpoint's body caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileBudget {
    allowance: u64,
    max_request_body: u64,
    max_response_bytes: u64,
}

impl FileBudget {
    /// A budget from the client allowance and the endpoint budgets.
    ///
    /// # Errors
    /// `validation`, operation `config`, when the allowance is outside 1 B–16 MiB.
    pub fn new(allowance: u64, budgets: &Budgets) -> Result<Self, Error> {
        if !(1..=MAX_FILE_ALLOWANCE).contains(&allowance) {
            return Err(
                Error::validation(Operation::Config, Reason::FileAllowanceOutOfRange)
                    .with_limit(allowance, MAX_FILE_ALLOWANCE),
            );
        }
        Ok(Self {
            allowance,
            max_request_body: budgets.max_request_body,
            max_response_bytes: budgets.max_response_bytes,
        })
    }

    /// The per-file allowance.
    pub const fn allowance(&self) -> u64 {
        self.allowance
    }
}

/// Largest profile per-direction (manifest) budget.
pub const MAX_DIRECTION_BUDGET: u64 = 67_108_864;

/// Checks the layered byte budgets of C6.3: profile per-file 1 B–16 MiB;
/// profile per-direction 1 B–64 MiB and ≥ per-file; client per-file
/// allowance ≥ the profile's per-file (C6.2); and a profile per-file above
/// 1 MiB needs request and response caps ≥ per-file.
///
/// # Errors
/// `validation`, operation `config`, with the offending numbers as limit.
pub fn check_byte_budgets(
    profile_per_file: u64,
    profile_per_direction: u64,
    client: &FileBudget,
) -> Result<(), Error> {
    let e = |r| Error::validation(Operation::Config, r);
    if !(1..=MAX_FILE_ALLOWANCE).contains(&profile_per_file) {
        return Err(
            e(Reason::ProfilePerFileOutOfRange).with_limit(profile_per_file, MAX_FILE_ALLOWANCE)
        );
    }
    if !(1..=MAX_DIRECTION_BUDGET).contains(&profile_per_direction) {
        return Err(e(Reason::ProfilePerDirectionOutOfRange)
            .with_limit(profile_per_direction, MAX_DIRECTION_BUDGET));
    }
    if profile_per_direction < profile_per_file {
        return Err(
            e(Reason::PerDirectionBelowPerFile).with_limit(profile_per_file, profile_per_direction)
        );
    }
    if client.allowance < profile_per_file {
        return Err(
            e(Reason::ClientAllowanceBelowProfile).with_limit(profile_per_file, client.allowance)
        );
    }
    if profile_per_file > SMALL_FILE_MAX {
        if client.max_request_body < profile_per_file {
            return Err(e(Reason::RequestCapBelowPerFile)
                .with_limit(profile_per_file, client.max_request_body));
        }
        if client.max_response_bytes < profile_per_file {
            return Err(e(Reason::ResponseCapBelowPerFile)
                .with_limit(profile_per_file, client.max_response_bytes));
        }
    }
    Ok(())
}

/// `PUT /api/v1/machines/{name}/files/{path}` (C6.1). The caller's SHA-256
/// is verified over the bytes before any request exists.
#[derive(Clone, Debug)]
pub struct Upload {
    name: MachineName,
    path: GuestPath,
    data: Bytes,
    check: Option<ImageCheck>,
}

/// A verified upload reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadReply {
    /// The guest path written.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

impl Upload {
    /// Checks policy, digest, size and version, in that order.
    ///
    /// # Errors
    /// `validation` (`upload` / `request_size`) or `unsupported_capability`,
    /// evidence `not_dispatched`.
    pub fn new(
        profile: &Profile,
        policy: &PathPolicy,
        budget: &FileBudget,
        name: MachineName,
        path: GuestPath,
        data: Bytes,
        sha256_hex: &str,
    ) -> Result<Self, Error> {
        let op = Operation::Upload;
        if !policy.allows_upload(&path) {
            return Err(Error::validation(op, Reason::PathOutsideUploadRoots));
        }
        let expected =
            parse_digest(sha256_hex).ok_or_else(|| Error::validation(op, Reason::InvalidSha256))?;
        let actual: [u8; 32] = Sha256::digest(&data).into();
        if actual != expected {
            return Err(Error::validation(op, Reason::Sha256Mismatch));
        }
        let size = data.len() as u64;
        if size > budget.allowance {
            return Err(Error::validation(op, Reason::FileAllowanceExceeded)
                .with_limit(size, budget.allowance));
        }
        if size > budget.max_request_body {
            return Err(
                Error::validation(Operation::RequestSize, Reason::RequestBodyTooLarge)
                    .with_limit(size, budget.max_request_body),
            );
        }
        let check = if needs_image_machine(size, &path) {
            profile.require(Feature::LargeFiles, op)?;
            Some(ImageCheck::new(profile, name.as_str(), op)?)
        } else {
            None
        };
        Ok(Self {
            name,
            path,
            data,
            check,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UploadWire {
    path: String,
    size: u64,
}

impl WorkerCall for Upload {
    type Output = UploadReply;

    fn operation(&self) -> Operation {
        Operation::Upload
    }

    fn request(&self) -> Result<Request, Error> {
        let target = machine_target(
            self.name.as_str(),
            &format!("/files/{}", self.path.encoded()),
        );
        Ok(Request::new(Operation::Upload, Method::Put, target)
            .accept(APPLICATION_JSON)
            .body(APPLICATION_OCTET_STREAM, self.data.clone()))
    }

    /// A file over 1 MiB or outside `/workspace` needs a plain image
    /// machine (C6.1).
    fn image_check(&self) -> Option<&ImageCheck> {
        self.check.as_ref()
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<UploadReply, Error> {
        let op = Operation::Upload;
        let w: UploadWire = decode_json(op, head, body)?;
        if w.path != self.path.as_str() || w.size != self.data.len() as u64 {
            return Err(Error::protocol(op, Reason::UploadReplyMismatch));
        }
        Ok(UploadReply {
            path: w.path,
            size: w.size,
        })
    }
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nib(b[2 * i])? << 4) | nib(b[2 * i + 1])?;
    }
    Some(out)
}

/// `GET /api/v1/machines/{name}/files/{path}` (C6.1) with an explicit
/// byte limit: 1 B–allowance; the reply cap is min(limit, max response bytes).
#[derive(Clone, Debug)]
pub struct Download {
    name: MachineName,
    path: GuestPath,
    cap: u64,
    max_response_bytes: u64,
    check: Option<ImageCheck>,
}

impl Download {
    /// Checks policy, limit and version.
    ///
    /// # Errors
    /// `validation` (`download`) or `unsupported_capability`, `not_dispatched`.
    pub fn new(
        profile: &Profile,
        policy: &PathPolicy,
        budget: &FileBudget,
        name: MachineName,
        path: GuestPath,
        max_bytes: u64,
    ) -> Result<Self, Error> {
        let op = Operation::Download;
        if !policy.allows_download(&path) {
            return Err(Error::validation(op, Reason::PathOutsideDownloadRoots));
        }
        if !(1..=budget.allowance).contains(&max_bytes) {
            return Err(Error::validation(op, Reason::DownloadLimitOutOfRange)
                .with_limit(max_bytes, budget.allowance));
        }
        let check = if needs_image_machine(max_bytes, &path) {
            profile.require(Feature::LargeFiles, op)?;
            Some(ImageCheck::new(profile, name.as_str(), op)?)
        } else {
            None
        };
        Ok(Self {
            name,
            path,
            cap: max_bytes.min(budget.max_response_bytes),
            max_response_bytes: budget.max_response_bytes,
            check,
        })
    }

    /// The byte cap of a successful reply body.
    pub const fn cap(&self) -> u64 {
        self.cap
    }

    /// An incremental decoder for this download.
    pub fn sink(&self) -> DownloadSink {
        DownloadSink {
            cap: self.cap,
            head: None,
            body: BytesMut::new(),
        }
    }
}

impl WorkerCall for Download {
    type Output = Bytes;

    fn operation(&self) -> Operation {
        Operation::Download
    }

    fn request(&self) -> Result<Request, Error> {
        let target = machine_target(
            self.name.as_str(),
            &format!("/files/{}", self.path.encoded()),
        );
        Ok(Request::new(Operation::Download, Method::Get, target).accept(APPLICATION_OCTET_STREAM))
    }

    /// As for [`Upload`]: a large or out-of-root file (C6.1).
    fn image_check(&self) -> Option<&ImageCheck> {
        self.check.as_ref()
    }

    fn decode(&self, head: &ResponseHead, body: &[u8]) -> Result<Bytes, Error> {
        let mut sink = self.sink();
        sink.handle_head(head)?;
        sink.handle_body(body)?;
        sink.finish()
    }

    fn max_response_bytes(&self) -> Option<u64> {
        // Room for an error reply to be classified, never past the endpoint cap.
        Some(
            self.cap
                .max(ERROR_BODY_ALLOWANCE)
                .min(self.max_response_bytes),
        )
    }
}

/// Incremental download decoder: `handle_head`, then `handle_body` per
/// chunk, then `finish`. A success body is never buffered past the cap.
#[derive(Debug)]
pub struct DownloadSink {
    cap: u64,
    head: Option<ResponseHead>,
    body: BytesMut,
}

impl DownloadSink {
    /// Checks the head: a 200 must be `application/octet-stream` and must not
    /// announce more than the cap.
    ///
    /// # Errors
    /// `protocol` or `output_limit`, `dispatch_uncertain`.
    pub fn handle_head(&mut self, head: &ResponseHead) -> Result<(), Error> {
        let op = Operation::Download;
        if head.status == 200 {
            check_media_type(op, head, APPLICATION_OCTET_STREAM)?;
            if let Some(n) = head.content_length
                && n > self.cap
            {
                return Err(Error::output_limit(
                    Operation::Download,
                    Evidence::DispatchUncertain,
                    Reason::DownloadCap,
                )
                .with_limit(n, self.cap));
            }
        }
        self.head = Some(head.clone());
        Ok(())
    }

    /// Appends a body chunk.
    ///
    /// # Errors
    /// `output_limit` when a success body passes the cap; `protocol` when
    /// called before `handle_head`.
    pub fn handle_body(&mut self, chunk: &[u8]) -> Result<(), Error> {
        let Some(head) = &self.head else {
            return Err(Error::protocol(Operation::Download, Reason::BodyBeforeHead));
        };
        let cap = if head.status == 200 {
            self.cap
        } else {
            ERROR_BODY_ALLOWANCE
        };
        let total = self.body.len() as u64 + chunk.len() as u64;
        if total > cap {
            if head.status != 200 {
                return Ok(()); // an error body is only classified; keep the prefix
            }
            return Err(Error::output_limit(
                Operation::Download,
                Evidence::DispatchUncertain,
                Reason::DownloadCap,
            )
            .with_limit(total, cap));
        }
        self.body.extend_from_slice(chunk);
        Ok(())
    }

    /// The file bytes, or the status error.
    ///
    /// # Errors
    /// The mapped status error (C1.2) for a non-200 reply.
    pub fn finish(self) -> Result<Bytes, Error> {
        let Some(head) = self.head else {
            return Err(Error::protocol(Operation::Download, Reason::BodyBeforeHead));
        };
        if head.status != 200 {
            return Err(status_error(Operation::Download, &head, &self.body));
        }
        Ok(self.body.freeze())
    }
}
