//! The closed list of reason codes an [`Error`](super::Error) can carry.
//!
//! One variant per fault, each with a stable snake_case code (its
//! [`Reason::as_str`]); the code is what output, logs and stored records carry.
//! A code is never peer text. Stored records keep the code as text, so a
//! record written by another version with a code this build does not know
//! still decodes (see `docs/decisions.md`, "Typed reasons");
//! [`Reason::from_code`] maps a known code back to its variant.

use core::fmt;

macro_rules! reasons {
    ($($(#[doc = $doc:literal])+ $variant:ident = $code:literal,)+) => {
        /// Why an operation failed, as a fixed code (see the module docs).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Reason {
            /// No reason was given (the code is empty, and output omits it).
            Unspecified,
            $($(#[doc = $doc])+ $variant,)+
        }

        impl Reason {
            /// Every reason but [`Reason::Unspecified`], in code order.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)+];

            /// The one-line doc of each reason in [`Reason::ALL`], in the same
            /// order (checked by a test: none is a placeholder).
            #[cfg(test)]
            const DOCS: &'static [&'static str] = &[$(concat!($($doc),+),)+];

            /// The stable snake_case code (empty for [`Reason::Unspecified`]).
            pub const fn as_str(self) -> &'static str {
                match self {
                    Self::Unspecified => "",
                    $(Self::$variant => $code,)+
                }
            }
        }
    };
}

reasons! {
    /// The WebSocket connection hit end of stream without a close frame from the peer (`transport`).
    AbnormalClose = "abnormal_close",
    /// A record patch tried to change a machine's already-set absence time (`validation`, store write).
    AbsenceWriteOnce = "absence_write_once",
    /// The store answered that no record exists for the key or name asked for (`not_found`).
    Absent = "absent",
    /// An HTTP request's `Accept` value was empty or held a byte not allowed in a header field (`validation`).
    Accept = "accept",
    /// The WebSocket upgrade reply had no single `Sec-WebSocket-Accept` matching the key sent (`protocol`).
    AcceptMismatch = "accept_mismatch",
    /// A machine record names an active execution the store does not hold (`store`).
    ActiveExecutionMissing = "active_execution_missing",
    /// A machine record holds an active execution while in a state that cannot run one (`validation`, store write).
    ActiveExecutionState = "active_execution_state",
    /// A logs request's byte allowance was 0 or above the maximum (`validation`).
    AllowanceOutOfRange = "allowance_out_of_range",
    /// A reservation was asked for a record that already holds an assignment or reservation (`validation`).
    AlreadyAssigned = "already_assigned",
    /// A slot operation named a machine whose record is already `deleted` (`validation`).
    AlreadyDeleted = "already_deleted",
    /// A create hit a machine of that name already on the worker (`identity_conflict`; raised by the simulated worker).
    AlreadyExists = "already_exists",
    /// A terminal ended with exit code 124, 130 or -1, which the worker also uses for timeout, interrupt and loss (`unknown`).
    AmbiguousExitCode = "ambiguous_exit_code",
    /// A stored machine spec names an architecture other than `x86_64` or `aarch64` (`validation`).
    Architecture = "architecture",
    /// A command spec has no argv entries (`validation`, nothing sent).
    ArgvEmpty = "argv_empty",
    /// One argv entry is longer than the per-entry limit (`validation`).
    ArgvEntryTooLong = "argv_entry_too_long",
    /// A command's program name (`argv[0]`) is the empty string (`validation`).
    ArgvFirstEmpty = "argv_first_empty",
    /// An argv entry contains a NUL byte (`validation`).
    ArgvNul = "argv_nul",
    /// A command has more argv entries than the limit (`validation`).
    ArgvTooMany = "argv_too_many",
    /// The argv entries together are longer than the total limit (`validation`).
    ArgvTotalTooLong = "argv_total_too_long",
    /// An artifact-store put under an existing key brought other bytes than the stored ones (`identity_conflict`, original kept).
    ArtifactDigestConflict = "artifact_digest_conflict",
    /// Bytes put into the artifact store do not have the SHA-256 given with them (`validation`, nothing stored).
    ArtifactDigestMismatch = "artifact_digest_mismatch",
    /// The directory artifact store's file system failed while reading or writing (`store`; never read as missing).
    ArtifactIo = "artifact_io",
    /// The artifact store holds no bytes under an input's source reference (`not_found`).
    ArtifactMissing = "artifact_missing",
    /// No configured worker's catalog holds the spec's exact artifact (id, digest and architecture), so nothing is stored (`unsupported_capability`).
    ArtifactNotInCatalog = "artifact_not_in_catalog",
    /// A path under the directory artifact store's root is a symbolic link or not the expected file type (`validation`, nothing read or written).
    ArtifactNotRegular = "artifact_not_regular",
    /// Bytes put into or read from the directory artifact store are over its per-file limit (`output_limit`).
    ArtifactOverPerFile = "artifact_over_per_file",
    /// The directory artifact store's per-file limit is outside 1 B to 16 MiB (`validation`, at open).
    ArtifactPerFileOutOfRange = "artifact_per_file_out_of_range",
    /// An input's bytes in the artifact store are not exactly its declared size (`validation`, nothing sent).
    ArtifactReadSize = "artifact_read_size",
    /// An artifact-store scope, reference or destination is not an identifier, so it names no file under the root (`validation`, nothing touched).
    ArtifactReference = "artifact_reference",
    /// The directory artifact store's root is not an absolute path of an existing directory of mode 0700 (`validation`, at open).
    ArtifactRoot = "artifact_root",
    /// A recorded artifact is larger than the maximum size its declaration allows (`validation`, store write).
    ArtifactSize = "artifact_size",
    /// A recorded artifact's path or destination is not declared in the spec (`validation`, store write).
    ArtifactUndeclared = "artifact_undeclared",
    /// A record's artifacts are not sorted by path without duplicates (`validation`, store write).
    ArtifactsNotSortedUnique = "artifacts_not_sorted_unique",
    /// No consumer attached to a managed terminal within its attach wait (`expired`).
    AttachWait = "attach_wait",
    /// A managed terminal spec's attach wait is outside its allowed range (`validation`).
    AttachWaitOutOfRange = "attach_wait_out_of_range",
    /// A sealed store payload failed to decrypt or authenticate with the configured key (`store`).
    AuthenticationFailed = "authentication_failed",
    /// A managed submit asked for a background command off a retained machine, the only place a launch runs (`unsupported_capability`, C5.4).
    Background = "background",
    /// A background command declares output files, which a launch never collects (`validation`, C5.4).
    BackgroundOutputs = "background_outputs",
    /// A background command spec also carries stdin (`validation`).
    BackgroundWithStdin = "background_with_stdin",
    /// A background command spec also carries a timeout (`validation`).
    BackgroundWithTimeout = "background_with_timeout",
    /// The worker base URL's host is missing or not a valid name or IP literal (`validation`, config).
    BaseUrlHost = "base_url_host",
    /// The worker base URL has a path other than `/` (`validation`, config).
    BaseUrlPath = "base_url_path",
    /// The worker base URL's port is not a number in 1–65535 (`validation`, config).
    BaseUrlPort = "base_url_port",
    /// The worker base URL has a query or a fragment (`validation`, config).
    BaseUrlQueryOrFragment = "base_url_query_or_fragment",
    /// The worker base URL's scheme is neither `http://` nor `https://` (`validation`, config).
    BaseUrlScheme = "base_url_scheme",
    /// The worker base URL is longer than the limit (`validation`, config).
    BaseUrlTooLong = "base_url_too_long",
    /// The worker base URL carries user info (`user@host`) (`validation`, config).
    BaseUrlUserinfo = "base_url_userinfo",
    /// The bearer token is empty or holds a byte that is not visible ASCII (`validation`, config).
    BearerToken = "bearer_token",
    /// A download decoder was given body bytes or finished before the response head (`protocol`).
    BodyBeforeHead = "body_before_head",
    /// A managed terminal spec's output buffer size is outside its allowed range (`validation`).
    BufferOutOfRange = "buffer_out_of_range",
    /// A managed terminal's output buffer is larger than the output allowance (`validation`).
    BufferOverAllowance = "buffer_over_allowance",
    /// A CA file or system roots were configured for an `http://` endpoint (`validation`, config).
    CaFileRequiresHttps = "ca_file_requires_https",
    /// A streamed exec's output callback did not return before the operation deadline (`transport`, dispatch uncertain).
    CallbackDeadline = "callback_deadline",
    /// The blocking shell could not start the thread that delivers streamed output to the callback (`admission_exhausted`).
    CallbackThreadSpawn = "callback_thread_spawn",
    /// All callback-delivery threads of the shell are busy (`admission_exhausted`, nothing sent).
    CallbackThreadsExhausted = "callback_threads_exhausted",
    /// An execution was to move to `dispatching` after its cancel was requested (`validation`, store write).
    CancelRequested = "cancel_requested",
    /// The worker's capacity reply has a boot id longer than the limit (`protocol`).
    CapacityBootIdTooLong = "capacity_boot_id_too_long",
    /// The worker's capacity reply has a used-CPU count that is negative or not finite (`protocol`).
    CapacityUsedCpusInvalid = "capacity_used_cpus_invalid",
    /// A worker catalog's checkpoint approval has a worker path that is not an absolute path ending `.smolcheckpoint` or `.checkpoint` (`validation`, config).
    CatalogCheckpointPath = "catalog_checkpoint_path",
    /// A worker catalog lists more checkpoint approvals than the limit of 32 (`validation`, config).
    CatalogCheckpoints = "catalog_checkpoints",
    /// A worker catalog lists two images, two checkpoints or two profiles under one id (`validation`, config).
    CatalogDuplicate = "catalog_duplicate",
    /// A worker catalog's allocation floor has a storage, overlay or host overhead value out of its range (`validation`, config).
    CatalogFloor = "catalog_floor",
    /// A worker catalog's image or checkpoint has a bad identifier or a digest that is not 64 lowercase hex characters (`validation`, config).
    CatalogImage = "catalog_image",
    /// A worker catalog's image artifact has an architecture other than the worker's (`validation`, config).
    CatalogImageArchitecture = "catalog_image_architecture",
    /// A worker catalog's image path is not an absolute path ending `.smolmachine` (`validation`, config).
    CatalogImagePath = "catalog_image_path",
    /// A worker catalog lists more image artifacts than the limit of 32 (`validation`, config).
    CatalogImages = "catalog_images",
    /// A worker catalog has neither an image artifact nor a checkpoint approval (`validation`, config).
    CatalogNoArtifact = "catalog_no_artifact",
    /// A worker catalog pairs macOS with x86_64, or a runtime version other than 1.14.1 with a platform other than Linux x86_64 or macOS aarch64 (`validation`, config).
    CatalogPlatform = "catalog_platform",
    /// A worker catalog lists no profile or more than the limit of 32 profiles (`validation`, config).
    CatalogProfiles = "catalog_profiles",
    /// A resubmitted named execution's spec differs from the one stored under that name (`identity_conflict`, CLI).
    ChangedSpec = "changed_spec",
    /// A machine created from a checkpoint also sets resources, ports, mounts or a workload (`validation`).
    CheckpointSourceRestrictions = "checkpoint_source_restrictions",
    /// A chunked response's chunk extension is longer than its limit (`output_limit`).
    ChunkExtension = "chunk_extension",
    /// A chunked response's size line or chunk data is not ended by CRLF (`protocol`).
    ChunkMissingCrlf = "chunk_missing_crlf",
    /// A chunked response's chunk-size line has no hex digits or an invalid byte (`protocol`).
    ChunkSize = "chunk_size",
    /// A chunked response's chunk size does not fit in 64 bits (`protocol`).
    ChunkSizeOverflow = "chunk_size_overflow",
    /// The caller's claim on the record has expired (`stale_claim`).
    ClaimExpired = "claim_expired",
    /// A record's claim carries a worker-lease generation that does not match its rule (`validation`, store write).
    ClaimGeneration = "claim_generation",
    /// The record is claimed by another owner (`stale_claim`).
    ClaimOwner = "claim_owner",
    /// A record's cleanup attempt count is above the maximum or set without cleanup (`validation`, store write).
    CleanupAttempts = "cleanup_attempts",
    /// A patch lowers a record's cleanup attempt count (`validation`, store write).
    CleanupAttemptsDecrease = "cleanup_attempts_decrease",
    /// A patch changes a cleanup that is already `complete` (`validation`, store write).
    CleanupCompletePermanent = "cleanup_complete_permanent",
    /// A disposable machine's cleanup deadline passed before its delete could be sent (`expired`, nothing sent; the reservation is kept).
    CleanupDeadline = "cleanup_deadline",
    /// A record's cleanup state does not fit its execution state (`validation`, store write).
    CleanupState = "cleanup_state",
    /// A cleanup marked complete without a recorded absence of the machine (`validation`, store write).
    CleanupWithoutAbsence = "cleanup_without_absence",
    /// The client's file allowance is below the worker version's per-file size (`validation`).
    ClientAllowanceBelowProfile = "client_allowance_below_profile",
    /// Only one of the client certificate and its key was configured (`validation`, config).
    ClientCertAndKeyGoTogether = "client_cert_and_key_go_together",
    /// A client certificate was configured for an `http://` endpoint (`validation`, config).
    ClientCertRequiresHttps = "client_cert_requires_https",
    /// The caller's clock is earlier than the record's last update time (`validation`, store write).
    ClockBeforeUpdatedAt = "clock_before_updated_at",
    /// A WebSocket close frame carries a close code that may not be sent on the wire (`protocol`).
    CloseCodeInvalid = "close_code_invalid",
    /// The caller asked to close a WebSocket with a code that may not be sent (`validation`).
    CloseCodeNotSendable = "close_code_not_sendable",
    /// A WebSocket close frame's payload is one byte, too short for a code (`protocol`).
    ClosePayloadOneByte = "close_payload_one_byte",
    /// A WebSocket close reason is longer than fits in a control frame (123 bytes).
    CloseReasonTooLong = "close_reason_too_long",
    /// The peer's close frame did not arrive within the close wait after ours was sent (`transport`; `expired` for a terminal close).
    CloseWaitExpired = "close_wait_expired",
    /// A terminal spec's close wait is outside its allowed range (`validation`).
    CloseWaitOutOfRange = "close_wait_out_of_range",
    /// A WebSocket send or receive was asked for after the connection closed (`validation`).
    Closed = "closed",
    /// A terminal connection closed before the upgrade completed (`transport`, dispatch uncertain).
    ClosedBeforeOpen = "closed_before_open",
    /// A managed terminal was closed because its execution was cancelled (`unknown`; raised by the simulation).
    ClosedByCancel = "closed_by_cancel",
    /// The client closed the terminal session before it ended (`unknown`, terminal close).
    ClosedByClient = "closed_by_client",
    /// The worker closed the terminal connection without sending the program's exit (`unknown`).
    ClosedWithoutExit = "closed_without_exit",
    /// The collection budget was spent before every declared output was downloaded (`expired`, exit kept).
    CollectionDeadline = "collection_deadline",
    /// A record's collection fields do not fit its execution state (`validation`, store write).
    CollectionState = "collection_state",
    /// A terminal spec's column count is 0 or above the maximum (`validation`).
    ColsOutOfRange = "cols_out_of_range",
    /// A retained machine's command slot already holds an active command (`admission_exhausted`).
    CommandActive = "command_active",
    /// A slot operation's command record names another machine (`validation`).
    CommandMachineMismatch = "command_machine_mismatch",
    /// The command named is not the machine's active execution (`validation`).
    CommandMismatch = "command_mismatch",
    /// The worker answered 409 Conflict (`identity_conflict`).
    Conflict = "conflict",
    /// Name lookup or TCP connect to the worker failed (`transport`, nothing sent).
    ConnectFailed = "connect_failed",
    /// The TCP connect (or TLS handshake) did not finish within its budget (`transport`, nothing sent).
    ConnectTimeout = "connect_timeout",
    /// The endpoint's connect timeout is outside its allowed range (`validation`, config).
    ConnectTimeoutOutOfRange = "connect_timeout_out_of_range",
    /// The connection closed before the reply (`transport`; raised by the simulated worker).
    ConnectionClosed = "connection_closed",
    /// The WebSocket upgrade reply lacks `Connection: upgrade` (`protocol`).
    ConnectionHeader = "connection_header",
    /// The worker refused the connection (`transport`, nothing sent; raised by the simulated worker).
    ConnectionRefused = "connection_refused",
    /// The connection was reset mid-operation (`transport`; raised by the simulated worker).
    ConnectionReset = "connection_reset",
    /// A managed terminal's consumer handle was dropped before the session ended (`unknown`).
    ConsumerLost = "consumer_lost",
    /// A response carries a `Content-Encoding` other than identity (`protocol`).
    ContentEncoding = "content_encoding",
    /// A response's `Content-Length` is not a plain decimal number (`protocol`).
    ContentLength = "content_length",
    /// A response has both `Content-Length` and `Transfer-Encoding` (`protocol`).
    ContentLengthAndTransferEncoding = "content_length_and_transfer_encoding",
    /// A response's `Content-Type` is not the one the call expects (`protocol`).
    ContentType = "content_type",
    /// A WebSocket continuation frame arrived with no fragmented message started (`protocol`).
    ContinuationWithoutStart = "continuation_without_start",
    /// A WebSocket control frame's payload is longer than 125 bytes (`protocol`).
    ControlFrameTooLong = "control_frame_too_long",
    /// A stored assignment row does not decode to a valid assignment (`store`).
    CorruptAssignment = "corrupt_assignment",
    /// A stored worker-lease row does not decode to a valid lease (`store`).
    CorruptLease = "corrupt_lease",
    /// `smolbox cp` was given two local or two remote paths; it needs one of each (`validation`, CLI).
    CpNeedsOneLocalOneRemote = "cp_needs_one_local_one_remote",
    /// A machine spec's CPU count is outside the allowed range (`validation`).
    CpusOutOfRange = "cpus_out_of_range",
    /// A create call answered with something other than the created machine (`protocol`).
    CreateReplyMismatch = "create_reply_mismatch",
    /// The worker reported a machine creation time beyond the accepted maximum (`protocol`).
    CreatedAtOutOfRange = "created_at_out_of_range",
    /// A machine record's state needs creation evidence and the record has none (`validation`, store write).
    CreationEvidence = "creation_evidence",
    /// A disposable machine's create may have reached the worker but its result is not known (`unknown`).
    CreationUncertain = "creation_uncertain",
    /// A patch tried to change a machine record's already-set creation evidence (`validation`, store write).
    CreationWriteOnce = "creation_write_once",
    /// The bytes sent to a terminal in total exceed the session's request limit (`output_limit`).
    CumulativeInput = "cumulative_input",
    /// A new WebSocket text or binary frame arrived while a fragmented message was still open (`protocol`).
    DataFrameInsideFragmentedMessage = "data_frame_inside_fragmented_message",
    /// The operation deadline ran out (`transport`); checkout or connect failures past it are relabelled with this reason.
    Deadline = "deadline",
    /// A patch tried to change a machine operation's already-set deadline (`validation`, store write).
    DeadlineSetOnce = "deadline_set_once",
    /// A patch set an operation deadline on a machine record with no operation in progress (`validation`, store write).
    DeadlineWithoutOperation = "deadline_without_operation",
    /// The worker's delete reply names another machine than the one deleted (`protocol`).
    DeletedNameMismatch = "deleted_name_mismatch",
    /// A `deleted` machine record still holds an execution, assignment or reserved ports (`validation`, store write).
    DeletedState = "deleted_state",
    /// `--detach` was used with the in-process devworker, which ends with the command (`validation`, CLI).
    DetachNeedsPersistentWorker = "detach_needs_persistent_worker",
    /// `run --detach` was given an `--output` with a local file: nobody is left to write it when the run ends (`validation`, nothing sent).
    DetachOutputLocal = "detach_output_local",
    /// The streamed exec's handle was dropped while the reply body was still being read (`transport`, dispatch uncertain).
    Detached = "detached",
    /// A stored digest is not a lowercase hex SHA-256 (`validation`, store write).
    Digest = "digest",
    /// A submit needs a disposable machine and no configured worker has a version profile to create one (`unsupported_capability`).
    DisposableMachines = "disposable_machines",
    /// A download's body is larger than its byte cap (`output_limit`).
    DownloadCap = "download_cap",
    /// A download's byte limit is 0 or above the file allowance (`validation`).
    DownloadLimitOutOfRange = "download_limit_out_of_range",
    /// A machine stop was recorded as intent while draining its slot, so its outcome is unknown (`unknown`).
    DrainStopIntent = "drain_stop_intent",
    /// A due-records page size is 0 or above the maximum page (`validation`, store).
    DueLimit = "due_limit",
    /// A response carries two `Content-Length` headers (`protocol`).
    DuplicateContentLength = "duplicate_content_length",
    /// A response carries two `Content-Type` headers (`protocol`).
    DuplicateContentType = "duplicate_content_type",
    /// A workload environment names the same variable twice (`validation`).
    DuplicateEnvName = "duplicate_env_name",
    /// A machine spec maps the same host port twice (`validation`).
    DuplicateHostPort = "duplicate_host_port",
    /// A network policy lists the same host or CIDR twice (`validation`).
    DuplicateNetworkEntry = "duplicate_network_entry",
    /// The controller configuration lists the same worker id twice (`validation`).
    DuplicateWorker = "duplicate_worker",
    /// The worker closed the connection before the response was complete (`transport`, dispatch uncertain).
    EarlyClose = "early_close",
    /// A stored command spec has no argv entries (`validation`, store write).
    EmptyArgv = "empty_argv",
    /// A network policy allows neither a host nor a CIDR (`validation`).
    EmptyNetworkPolicy = "empty_network_policy",
    /// A file policy has no workdir roots (`validation`).
    EmptyWorkdirRoots = "empty_workdir_roots",
    /// A stored machine spec carries an empty workload list (`validation`, store write).
    EmptyWorkload = "empty_workload",
    /// A record could not be serialised into its stored envelope (`store`).
    Encode = "encode",
    /// A command's environment names the same variable twice (`validation`).
    EnvNameDuplicate = "env_name_duplicate",
    /// A command's environment variable name is not a valid name (`validation`).
    EnvNameInvalid = "env_name_invalid",
    /// A command's environment variable name is longer than the limit (`validation`).
    EnvNameTooLong = "env_name_too_long",
    /// A CLI `--env` value is not of the form `KEY=VALUE` (`validation`, CLI).
    EnvNotKEqualsV = "env_not_k_equals_v",
    /// A command has more environment variables than the limit (`validation`).
    EnvTooMany = "env_too_many",
    /// An environment variable value is longer than the limit (`validation`).
    EnvValueTooLong = "env_value_too_long",
    /// A stored envelope is shorter than its fixed header (`store`).
    EnvelopeShort = "envelope_short",
    /// The connection ended before the WebSocket upgrade reply was complete (`transport`).
    EofDuringHandshake = "eof_during_handshake",
    /// A streamed exec's reply ended in the middle of an event after the exit event (`protocol`).
    EofInsideFrame = "eof_inside_frame",
    /// A streamed exec's reply ended without an exit event (`protocol`).
    EofWithoutExit = "eof_without_exit",
    /// A streamed exec's reply sent an `error` event after the exit event (`protocol`).
    ErrorAfterExit = "error_after_exit",
    /// A record's error entry has an empty or non-snake_case operation or reason (`validation`, store write).
    ErrorEntry = "error_entry",
    /// A record holds more error entries than its history limit (`validation`, store write).
    ErrorHistory = "error_history",
    /// A record's evidence is not one its execution state allows (`validation`, store write).
    EvidenceState = "evidence_state",
    /// `exec --input`/`--output` named a machine that is not a managed machine of the store: files go only into a managed machine's slot (`validation`, nothing sent).
    ExecFilesNeedManagedMachine = "exec_files_need_managed_machine",
    /// A buffered exec reply's stdout or stderr is not valid base64 (`protocol`).
    ExecReplyBase64 = "exec_reply_base64",
    /// A buffered exec reply is not the expected JSON (`protocol`).
    ExecReplyInvalid = "exec_reply_invalid",
    /// A command names a user, which worker version 1.9.2 does not support (`unsupported_capability`, nothing sent).
    ExecUserNotInVersion = "exec_user_not_in_version",
    /// A managed execution's deadline passed after it may have been dispatched (`expired`, dispatch uncertain).
    ExecutionDeadline = "execution_deadline",
    /// A slot was to be finished while its command has not ended (`validation`).
    ExecutionNotFinished = "execution_not_finished",
    /// A slot was to be taken for a command that is already past dispatch (`validation`).
    ExecutionNotPending = "execution_not_pending",
    /// A terminal's exit frame carries a code that does not fit in 32 bits (`protocol`).
    ExitCodeOutOfRange = "exit_code_out_of_range",
    /// A streamed exec's exit event is not the expected JSON (`protocol`).
    ExitInvalid = "exit_invalid",
    /// A record uses a feature newer than the envelope version it is to be written in (`store`).
    FeatureBeyondVersion = "feature_beyond_version",
    /// The call needs a feature the worker's version profile lacks (`unsupported_capability`, nothing sent).
    FeatureNotInVersion = "feature_not_in_version",
    /// A file to upload is larger than the file allowance (`validation`).
    FileAllowanceExceeded = "file_allowance_exceeded",
    /// The configured file allowance is 0 or above the maximum (`validation`, config).
    FileAllowanceOutOfRange = "file_allowance_out_of_range",
    /// A configured TLS file (CA, certificate or key) is not a regular file (`validation`, config).
    FileNotRegular = "file_not_regular",
    /// Two inputs share a source or two outputs share a destination reference (`validation`, C6.4).
    FileReferenceDuplicate = "file_reference_duplicate",
    /// A `run --input` or `--output` value is not `LOCAL:GUEST_PATH` or `GUEST_PATH[:LOCAL]` (`validation`, nothing sent).
    FileFlagSyntax = "file_flag_syntax",
    /// A managed submit has input or output files and the runtime has no artifact store to transfer them from or to (`unsupported_capability`).
    FileTransfer = "file_transfer",
    /// A stored spec's input or output files are not sorted by path without duplicates (`validation`, store write).
    FilesNotSortedUnique = "files_not_sorted_unique",
    /// A record exists under this key or name with a different fingerprint (`identity_conflict`, nothing sent).
    FingerprintDiffers = "fingerprint_differs",
    /// The store's key check was sealed with another fingerprint key (`store`).
    FingerprintKeyMismatch = "fingerprint_key_mismatch",
    /// `smolbox logs --follow` saw the log stream end without the machine stopping (`protocol`, CLI).
    FollowEnded = "follow_ended",
    /// A managed logs request asked to follow, which a single request cannot do (`validation`).
    FollowUnsupported = "follow_unsupported",
    /// The worker answered 403 Forbidden (`authentication`).
    Forbidden = "forbidden",
    /// A patch moves a record's evidence to a value it cannot move to (`validation`, store write).
    ForbiddenEvidence = "forbidden_evidence",
    /// A patch or slot operation moves a record to a state it cannot move to (`validation`).
    ForbiddenTransition = "forbidden_transition",
    /// A WebSocket control frame arrived without the FIN bit (`protocol`).
    FragmentedControlFrame = "fragmented_control_frame",
    /// A WebSocket frame is larger than the receive limit (`output_limit`).
    FrameTooLarge = "frame_too_large",
    /// A worker lease's generation counter reached its maximum (`validation`, store claim).
    GenerationExhausted = "generation_exhausted",
    /// The WebSocket upgrade did not complete within the handshake timeout (`transport`).
    HandshakeTimeout = "handshake_timeout",
    /// A terminal or WebSocket handshake timeout is zero or above the maximum (`validation`).
    HandshakeTimeoutOutOfRange = "handshake_timeout_out_of_range",
    /// The WebSocket upgrade reply's head is longer than the limit (`protocol`).
    HandshakeTooLarge = "handshake_too_large",
    /// A response head is longer than the head limit (`output_limit`).
    HeadBytes = "head_bytes",
    /// A response has more header fields than the limit (`output_limit`).
    HeaderCount = "header_count",
    /// The worker's health reply says more machines run than exist (`protocol`).
    HealthRunningExceedsTotal = "health_running_exceeds_total",
    /// The worker's health reply status is not `ok` (`protocol`).
    HealthStatusNotOk = "health_status_not_ok",
    /// The worker's health reply machine total is above the accepted maximum (`protocol`).
    HealthTotalOutOfRange = "health_total_out_of_range",
    /// The worker's health reply version is not a semantic version (`protocol`).
    HealthVersionInvalid = "health_version_invalid",
    /// Another owner holds a live worker lease (`stale_claim`).
    HeldByOther = "held_by_other",
    /// A PostgreSQL store partition still holds history and was not dropped (`store`).
    HistoryNotEmpty = "history_not_empty",
    /// The HTTP request's `Host` value is empty or holds a byte that is not visible ASCII (`validation`, config).
    Host = "host",
    /// A host port asked for is already reserved by another machine on the worker (`port_conflict`, nothing sent).
    HostPortTaken = "host_port_taken",
    /// The WebSocket upgrade reply is not HTTP/1.1 (`protocol`).
    HttpVersion = "http_version",
    /// An `https://` endpoint was configured without a bearer token (`validation`, config).
    HttpsRequiresToken = "https_requires_token",
    /// A stored identifier is empty, too long or holds a byte outside its alphabet (`validation`, store write).
    Identifier = "identifier",
    /// A sealed record's bound identity differs from the key it was read under (`store`).
    IdentityMismatch = "identity_mismatch",
    /// A terminal session saw no traffic within its idle budget (`expired`).
    IdleBudget = "idle_budget",
    /// A terminal spec's idle budget is below the minimum or above the session budget (`validation`).
    IdleBudgetOutOfRange = "idle_budget_out_of_range",
    /// An exchange saw no bytes within its idle timeout (`transport`).
    IdleTimeout = "idle_timeout",
    /// A WebSocket idle timeout is zero or above the maximum (`validation`).
    IdleTimeoutOutOfRange = "idle_timeout_out_of_range",
    /// The machine was replaced on the worker (another incarnation) during the operation (`identity_conflict`).
    IncarnationChanged = "incarnation_changed",
    /// A record names another incarnation of the machine than the one observed (`identity_conflict`).
    IncarnationMismatch = "incarnation_mismatch",
    /// One terminal input chunk is larger than the per-chunk limit (`validation`).
    InputChunkTooLarge = "input_chunk_too_large",
    /// A managed terminal spec's input byte limit is outside its allowed range (`validation`).
    InputLimitOutOfRange = "input_limit_out_of_range",
    /// Terminal input was sent while earlier input still exceeds the send buffer (`validation`).
    InputNotDrained = "input_not_drained",
    /// A declared input is larger than the profile's per-file budget (`validation`, C6.4).
    InputOverPerFile = "input_over_per_file",
    /// Terminal input is empty or larger than the session's input limit (`validation`).
    InputSize = "input_size",
    /// Insecure loopback was allowed on an `https://` endpoint (`validation`, config).
    InsecureWithHttps = "insecure_with_https",
    /// A dispatch intent found in the store belongs to another controller, so its outcome is unknown (`unknown`, dispatch uncertain).
    IntentNotMine = "intent_not_mine",
    /// A patch records a dispatch intent without a live claim (`validation`, store write).
    IntentWithoutClaim = "intent_without_claim",
    /// A checkpoint source path is not a worker path ending in `.smolcheckpoint` or `.checkpoint` (`validation`).
    InvalidCheckpointPath = "invalid_checkpoint_path",
    /// A network policy CIDR does not parse (`validation`).
    InvalidCidr = "invalid_cidr",
    /// A workload environment variable name is not a valid name (`validation`).
    InvalidEnvName = "invalid_env_name",
    /// A configured file path is empty or contains NUL (`validation`, config).
    InvalidFilePath = "invalid_file_path",
    /// A guest path is not absolute or holds a forbidden segment or byte (`validation`).
    InvalidGuestPath = "invalid_guest_path",
    /// A WebSocket `Host` value is empty, contains a space or an unsafe byte (`validation`).
    InvalidHost = "invalid_host",
    /// A network policy hostname is not a valid DNS name (`validation`).
    InvalidHostname = "invalid_hostname",
    /// An image source path is not a worker path ending in `.smolmachine` (`validation`).
    InvalidImagePath = "invalid_image_path",
    /// A worker reply with status 200 is not the expected JSON (`protocol`).
    InvalidJsonReply = "invalid_json_reply",
    /// A machine in the worker's reply is not the expected JSON (`protocol`).
    InvalidMachineJson = "invalid_machine_json",
    /// A machine name breaks the naming rule (`validation`).
    InvalidMachineName = "invalid_machine_name",
    /// A mount's source path is not a valid absolute path (`validation`).
    InvalidMountSource = "invalid_mount_source",
    /// A mount's target path is not under the mount root (`validation`).
    InvalidMountTarget = "invalid_mount_target",
    /// A machine namespace breaks the naming rule (`validation`).
    InvalidNamespace = "invalid_namespace",
    /// An OCI source reference does not parse (`validation`).
    InvalidOciReference = "invalid_oci_reference",
    /// A port mapping uses port 0 (`validation`).
    InvalidPort = "invalid_port",
    /// A custom version profile's version text is not a semantic version (`validation`, config).
    InvalidProfileVersion = "invalid_profile_version",
    /// A registry source reference does not parse (`validation`).
    InvalidRegistryReference = "invalid_registry_reference",
    /// A registry identity token is empty, too long or not visible ASCII (`validation`).
    InvalidRegistryToken = "invalid_registry_token",
    /// A given SHA-256 is not 64 hex digits (`validation`, CLI).
    InvalidSha256 = "invalid_sha256",
    /// A Unix socket path is not absolute, too long or contains NUL (`validation`, config).
    InvalidSocketPath = "invalid_socket_path",
    /// A WebSocket request target does not start with `/` or holds an unsafe byte (`validation`).
    InvalidTarget = "invalid_target",
    /// The bearer token is empty, too long or not visible ASCII (`validation`, config).
    InvalidToken = "invalid_token",
    /// A WebSocket text message or close reason is not valid UTF-8 (`protocol`).
    InvalidUtf8 = "invalid_utf8",
    /// A volume id breaks the naming rule (`validation`).
    InvalidVolumeId = "invalid_volume_id",
    /// A worker id breaks the naming rule (`validation`, config).
    InvalidWorkerId = "invalid_worker_id",
    /// A workload entrypoint or cmd argument is too long or contains NUL (`validation`).
    InvalidWorkloadArg = "invalid_workload_arg",
    /// A workload's workdir is not absolute, too long or contains NUL (`validation`).
    InvalidWorkloadWorkdir = "invalid_workload_workdir",
    /// The store's key file could not be created (`store`).
    KeyCreate = "key_create",
    /// The sealing key is the same as the fingerprint key (`validation`).
    KeyEqualsFingerprintKey = "key_equals_fingerprint_key",
    /// A store key file is not exactly 32 bytes (`validation`).
    KeyLength = "key_length",
    /// The store was written with another sealing key than the one configured (`store`).
    KeyMismatch = "key_mismatch",
    /// The store database exists but its key files do not (`store`).
    KeyMissing = "key_missing",
    /// A store key file is readable or writable by group or others (`validation`).
    KeyPermissions = "key_permissions",
    /// No randomness was available to generate a store key (`store`).
    KeyRandom = "key_random",
    /// A store key file could not be read (`store`).
    KeyRead = "key_read",
    /// The directory of a new store key file could not be synced (`store`).
    KeySync = "key_sync",
    /// A new store key file could not be written and synced (`store`).
    KeyWrite = "key_write",
    /// A launch reply's output is not the expected `pid=<n>` line (`protocol`).
    LaunchAckShape = "launch_ack_shape",
    /// A launch's wrapper command exited non-zero, so the background program was not started (`protocol`).
    LaunchExitNonzero = "launch_exit_nonzero",
    /// A launch reply's pid does not fit in 32 bits (`protocol`).
    LaunchPidRange = "launch_pid_range",
    /// `launch` was called with a command that is not marked background (`validation`).
    LaunchRequiresBackground = "launch_requires_background",
    /// A launch's wrapper command wrote to stderr (`protocol`).
    LaunchStderr = "launch_stderr",
    /// A launch was answered like a foreground exec, without a launch acknowledgement (`protocol`).
    LaunchWithoutAck = "launch_without_ack",
    /// The SQLite store uses an older table layout that this build must migrate first (`store`).
    LayoutNeedsMigration = "layout_needs_migration",
    /// The controller's lease TTL is outside 1,000–900,000 ms or under four poll intervals (`validation`, config).
    LeaseTtl = "lease_ttl",
    /// `SMOLBOX_LEASE_TTL_MS` is not a number in 1,000–900,000 (`validation`, CLI).
    LeaseTtlOutOfRange = "lease_ttl_out_of_range",
    /// A record is sealed in the legacy v1 format and the store does not accept it (`store`).
    LegacySealedVersion = "legacy_sealed_version",
    /// A WebSocket frame's 64-bit length has its top bit set (`protocol`).
    LengthTopBitSet = "length_top_bit_set",
    /// A machine lifecycle request names no action, or `create` (`validation`).
    LifecycleAction = "lifecycle_action",
    /// A list page size is 0 or above the maximum page (`validation`, store).
    ListLimit = "list_limit",
    /// The worker's machine list has more entries than the limit (`output_limit`).
    ListTooLong = "list_too_long",
    /// The logs reply is larger than the logs byte allowance (`output_limit`).
    LogAllowance = "log_allowance",
    /// The logs reply has more events than the limit (`output_limit`).
    LogEventCap = "log_event_cap",
    /// A log line in the worker's reply is not valid UTF-8 (`protocol`).
    LogLineNotUtf8 = "log_line_not_utf8",
    /// The logs reply ended in the middle of an event (`protocol`).
    LogPartialFrame = "log_partial_frame",
    /// A CLI machine action other than reading a managed record was asked without a worker (`validation`, CLI).
    MachineActionNeedsAWorker = "machine_action_needs_a_worker",
    /// A lifecycle request names a machine whose record is `deleted` (`not_found`, nothing sent).
    MachineDeleted = "machine_deleted",
    /// The worker reports a machine with GPU or CUDA, which smolbox does not model (`protocol`).
    MachineGpuUnsupported = "machine_gpu_unsupported",
    /// The worker reports a staged mount, which smolbox does not model (`protocol`).
    MachineMountStaged = "machine_mount_staged",
    /// The worker's version must say whether a mount is staged and the reply does not (`protocol`).
    MachineMountStagedMissing = "machine_mount_staged_missing",
    /// A stored machine name breaks the naming rule (`validation`, store write).
    MachineName = "machine_name",
    /// The worker reports a machine name that breaks the naming rule (`protocol`).
    MachineNameInvalid = "machine_name_invalid",
    /// The machine name is already reserved on that worker by another record (`identity_conflict`, nothing sent).
    MachineNameTaken = "machine_name_taken",
    /// The worker reports a network backend other than `virtio-net` or `tsi` (`protocol`).
    MachineNetworkBackendUnknown = "machine_network_backend_unknown",
    /// The worker reports an allow-list without the `virtio-net` backend (`protocol`).
    MachineNetworkIncoherent = "machine_network_incoherent",
    /// The worker reports an allow-list host or CIDR that does not parse (`protocol`).
    MachineNetworkInvalid = "machine_network_invalid",
    /// The machine is absent on the worker (`not_found`; raised by the simulated worker).
    MachineNotFound = "machine_not_found",
    /// A retained machine is not running idle (another operation is in progress) (`admission_exhausted`).
    MachineNotIdle = "machine_not_idle",
    /// A managed terminal's machine record has no creation evidence or assignment (`admission_exhausted`).
    MachineNotOwned = "machine_not_owned",
    /// The machine is not running on the worker (`not_found`; raised by the simulated worker).
    MachineNotRunning = "machine_not_running",
    /// The worker reports a port mapping outside 1–65535 (`protocol`).
    MachinePortInvalid = "machine_port_invalid",
    /// The worker reports port mappings without the `virtio-net` backend (`protocol`).
    MachinePortsNeedVirtioNet = "machine_ports_need_virtio_net",
    /// The worker reports CPU, memory or disk sizes outside the accepted ranges (`protocol`).
    MachineResourcesOutOfRange = "machine_resources_out_of_range",
    /// The worker reports a machine state other than created, running or stopped (`protocol`).
    MachineStateUnsupported = "machine_state_unsupported",
    /// A response head does not parse as HTTP/1.1 (`protocol`).
    MalformedHead = "malformed_head",
    /// A reservation was asked for a command that runs on a named managed machine (`validation`, store).
    ManagedCommandHasNoReservation = "managed_command_has_no_reservation",
    /// A record's managed-machine key differs from the one in its spec (`validation`, store write).
    ManagedMachine = "managed_machine",
    /// The managed machine has no worker assignment yet (`validation`, CLI).
    ManagedMachineNotPlaced = "managed_machine_not_placed",
    /// A managed machine was asked for with only the in-process devworker, which ends with the command (`validation`, CLI).
    ManagedNeedsPersistentWorker = "managed_needs_persistent_worker",
    /// `--cpus` or `--memory` was given for a managed machine, whose size comes from the profile (`validation`, CLI).
    ManagedSizeIsTheProfiles = "managed_size_is_the_profiles",
    /// The input sizes, or the output maxima, sum above the per-direction aggregate budget (`validation`, C6.4).
    ManifestOverAggregate = "manifest_over_aggregate",
    /// No randomness is left to mask the next WebSocket frame (`validation`).
    MaskEntropyExhausted = "mask_entropy_exhausted",
    /// A WebSocket frame from the server is masked (`protocol`).
    MaskedServerFrame = "masked_server_frame",
    /// The controller's active-task limit is outside its allowed range (`validation`, config).
    MaxActive = "max_active",
    /// The memory store's byte limit is outside its allowed range (`validation`, config).
    MaxBytes = "max_bytes",
    /// The HTTP client's chunk-extension limit is above 64 KiB (`validation`, config).
    MaxChunkExtension = "max_chunk_extension",
    /// A WebSocket frame length limit is 0 or above the maximum (`validation`, config).
    MaxFrameLenOutOfRange = "max_frame_len_out_of_range",
    /// The HTTP client's head-size limit is 0 or above its ceiling (`validation`, config).
    MaxHeadBytes = "max_head_bytes",
    /// The HTTP client's header-count limit is 0 or above its ceiling (`validation`, config).
    MaxHeaders = "max_headers",
    /// A WebSocket message length limit is 0 or above the maximum (`validation`, config).
    MaxMessageLenOutOfRange = "max_message_len_out_of_range",
    /// The store already holds as many pending executions as allowed (`admission_exhausted`), or the configured limit is out of range (`validation`).
    MaxPending = "max_pending",
    /// The memory store's record limit is outside its allowed range (`validation`, config).
    MaxRecords = "max_records",
    /// The HTTP client's request-body limit is 0 or above its ceiling (`validation`, config).
    MaxRequestBody = "max_request_body",
    /// The endpoint's request-body limit is outside its allowed range (`validation`, config).
    MaxRequestBodyOutOfRange = "max_request_body_out_of_range",
    /// A terminal's cumulative request limit is zero (`validation`).
    MaxRequestBytesZero = "max_request_bytes_zero",
    /// The HTTP client's response-body limit is 0 or above its ceiling (`validation`, config).
    MaxResponseBody = "max_response_body",
    /// The endpoint's response-byte limit is outside its allowed range (`validation`, config).
    MaxResponseBytesOutOfRange = "max_response_bytes_out_of_range",
    /// The HTTP client's trailer limit is above 64 KiB (`validation`, config).
    MaxTrailerBytes = "max_trailer_bytes",
    /// The memory store's byte limit would be exceeded by the write (`admission_exhausted`).
    MemoryBytes = "memory_bytes",
    /// The memory store already holds its maximum number of worker leases (`admission_exhausted`).
    MemoryLeases = "memory_leases",
    /// A machine spec's memory size is outside the allowed range (`validation`).
    MemoryOutOfRange = "memory_out_of_range",
    /// The memory store already holds its maximum number of records (`admission_exhausted`).
    MemoryRecords = "memory_records",
    /// A WebSocket message is larger than the receive limit (`output_limit`).
    MessageTooLarge = "message_too_large",
    /// A spec's metadata integer is outside the JSON safe-integer range (`validation`, store write).
    MetadataInteger = "metadata_integer",
    /// A spec's metadata string is longer than the limit (`validation`, store write).
    MetadataString = "metadata_string",
    /// The worker's metrics reply is not valid UTF-8 (`protocol`).
    MetricsNotUtf8 = "metrics_not_utf8",
    /// The operation needs a machine created from a plain image and this one is not (`unsupported_capability`).
    NeedsPlainImageMachine = "needs_plain_image_machine",
    /// The spec asks for an outbound allowlist and no configured worker's admitted version allows network policies, so nothing is stored (`unsupported_capability`).
    NetworkPolicyNotInVersion = "network_policy_not_in_version",
    /// The worker reports an open network where the spec asked for an allow-list or none (`unsupported_network_policy`).
    NetworkWithoutAllowlist = "network_without_allowlist",
    /// A terminal consumer's `next` found no output and no end within its wait (`expired`; the session keeps running).
    NextTimeout = "next_timeout",
    /// The CLI could not read back the acceptance it just stored (`store`, CLI).
    NoAcceptance = "no_acceptance",
    /// A fenced write was asked for a record that holds no claim (`stale_claim`).
    NoClaim = "no_claim",
    /// A delete or slot operation needs the machine's creation evidence and the record has none (`validation`).
    NoCreationEvidence = "no_creation_evidence",
    /// A machine request has no first operation to run (`protocol`).
    NoInitialOp = "no_initial_op",
    /// A submit has neither a named machine nor a placement to run on (`validation`).
    NoMachine = "no_machine",
    /// The operating system gave no randomness for a key, a token or a WebSocket mask.
    NoRandomness = "no_randomness",
    /// A managed terminal open found no terminal spec on the record (`validation`).
    NoSpec = "no_spec",
    /// `--no-start` was given for a raw worker create; only managed machines support it (`validation`, CLI).
    NoStartIsManagedOnly = "no_start_is_managed_only",
    /// The blocking shell could not start the thread of a managed terminal (`admission_exhausted`).
    NoThread = "no_thread",
    /// The tokio runtime was built outside a tokio runtime context (`validation`, config).
    NoTokioRuntime = "no_tokio_runtime",
    /// The worker reported a volume path that is not normalised (`protocol`).
    NodePathNotNormalized = "node_path_not_normalized",
    /// A WebSocket frame length uses a longer encoding than needed (`protocol`).
    NonMinimalLength = "non_minimal_length",
    /// The spec's action is not a command where a command is needed (`validation`).
    NotACommand = "not_a_command",
    /// A slot operation was asked for an execution without a machine (`validation`, store).
    NotAMachineCommand = "not_a_machine_command",
    /// A terminal call named an execution whose action is not a terminal (`validation`).
    NotATerminal = "not_a_terminal",
    /// A resolve or release named a machine record with no assignment (`identity_conflict`, nothing sent).
    NotAssigned = "not_assigned",
    /// The worker answered 404 Not Found (`not_found`).
    NotFound = "not_found",
    /// An accept was asked for a record not in state `accepted` at version 1 (`validation`, store).
    NotFreshlyAccepted = "not_freshly_accepted",
    /// A terminal send was asked before the session was opened (`validation`).
    NotOpen = "not_open",
    /// A slot drain was asked while the machine still has work in flight (`validation`).
    NotQuiesced = "not_quiesced",
    /// A release or cleanup step was asked for a record without a reservation (`validation`, store).
    NotReserved = "not_reserved",
    /// A slot was to be finished by an execution that does not hold it (`validation`).
    NotSlotHolder = "not_slot_holder",
    /// A slot operation needs the machine stopped and the record shows it is not (`identity_conflict`).
    NotStopped = "not_stopped",
    /// A patch records an observation of another incarnation than the record's creation (`validation`, store write).
    ObservationIncarnation = "observation_incarnation",
    /// The machine record changed while an observation was in flight, so the reply is not written (`stale_version`).
    ObservationOutdated = "observation_outdated",
    /// A slot operation was asked while another machine operation is in progress (`admission_exhausted`).
    OperationInProgress = "operation_in_progress",
    /// A machine record has an operation without a phase, or a phase without an operation (`validation`, store write).
    OperationPhase = "operation_phase",
    /// The endpoint's operation timeout is outside its allowed range (`validation`, config).
    OperationTimeoutOutOfRange = "operation_timeout_out_of_range",
    /// A streamed exec's reply sent output after the exit event (`protocol`).
    OutputAfterExit = "output_after_exit",
    /// A command's output is larger than its output allowance (`output_limit`).
    OutputAllowance = "output_allowance",
    /// A command's output allowance is 0 or above the maximum (`validation`).
    OutputAllowanceOutOfRange = "output_allowance_out_of_range",
    /// A streamed exec's output event is not valid UTF-8 (`protocol`).
    OutputInvalidUtf8 = "output_invalid_utf8",
    /// A declared output's max size is 0 or above the profile's per-file budget (`validation`, C6.4).
    OutputMaxRange = "output_max_range",
    /// Two `run --output` values name the same local file (`validation`, nothing sent).
    OutputLocalDuplicate = "output_local_duplicate",
    /// Two mounts of a machine spec have the same or nested targets (`validation`).
    OverlappingMountTargets = "overlapping_mount_targets",
    /// A machine spec's overlay disk size is outside the allowed range (`validation`).
    OverlayOutOfRange = "overlay_out_of_range",
    /// The controller's owner name is not a valid identifier (`validation`, config).
    Owner = "owner",
    /// The store partition name is not a valid identifier (`validation`, config).
    Partition = "partition",
    /// The PostgreSQL store has no partition of that name (`store`).
    PartitionMissing = "partition_missing",
    /// A download path is outside the policy's download roots (`validation`).
    PathOutsideDownloadRoots = "path_outside_download_roots",
    /// An upload path is outside the policy's upload roots (`validation`).
    PathOutsideUploadRoots = "path_outside_upload_roots",
    /// A stored envelope's payload does not decode to the record kind (`store`).
    PayloadDecode = "payload_decode",
    /// A stored envelope's payload is not in canonical form (`store`).
    PayloadNotCanonical = "payload_not_canonical",
    /// An encoded record's payload is larger than the envelope limit (`store`).
    PayloadTooLarge = "payload_too_large",
    /// A version profile's per-direction file budget is below its per-file size (`validation`, config).
    PerDirectionBelowPerFile = "per_direction_below_per_file",
    /// A WebSocket ping payload is longer than 125 bytes (`validation`).
    PingPayloadTooLong = "ping_payload_too_long",
    /// An `http://` endpoint names a host that is not loopback (`validation`, config).
    PlainHttpRequiresLoopback = "plain_http_requires_loopback",
    /// An `http://` TCP endpoint was configured without allowing insecure loopback (`validation`, config).
    PlainHttpRequiresOptIn = "plain_http_requires_opt_in",
    /// The controller's poll interval is outside 10–5,000 ms (`validation`, config).
    PollInterval = "poll_interval",
    /// The endpoint's pool checkout budget is outside its allowed range (`validation`, config).
    PoolCheckoutOutOfRange = "pool_checkout_out_of_range",
    /// No pooled connection became free within the checkout budget (`transport`, nothing sent).
    PoolCheckoutTimeout = "pool_checkout_timeout",
    /// The connection pool was closed while waiting for a connection (`transport`, nothing sent).
    PoolClosed = "pool_closed",
    /// The worker answered a start with 409 "port in use" (`port_conflict`).
    PortInUse = "port_in_use",
    /// A stored spec's ports are not sorted by host port, repeat one, or use port 0 (`validation`, store write).
    Ports = "ports",
    /// PostgreSQL reported an error with a code not classified otherwise (`store`).
    Postgres = "postgres",
    /// The PostgreSQL CA bundle is too large, holds no certificate or a malformed one (`validation`, config).
    PostgresCa = "postgres_ca",
    /// The PostgreSQL CA file cannot be read or is too large (`validation`, config).
    PostgresCaFile = "postgres_ca_file",
    /// PostgreSQL refused a write on a unique or foreign-key constraint (`store`).
    PostgresConstraint = "postgres_constraint",
    /// A PostgreSQL transaction kept hitting serialisation failures or deadlocks past its retries (`store`).
    PostgresContention = "postgres_contention",
    /// The PostgreSQL connection failed without an SQL state (`store`).
    PostgresIo = "postgres_io",
    /// A PostgreSQL URL names a remote host without TLS and without the plaintext opt-in (`validation`, config).
    PostgresPlaintextRemote = "postgres_plaintext_remote",
    /// The PostgreSQL TLS setup failed, or the server's TLS was refused (untrusted certificate, name mismatch, no TLS) (`validation` or `store`).
    PostgresTls = "postgres_tls",
    /// TLS was asked for a PostgreSQL connection over a Unix socket (`validation`, config).
    PostgresTlsUnixSocket = "postgres_tls_unix_socket",
    /// The PostgreSQL connection is closed or the server is shutting down or not accepting connections (`store`).
    PostgresUnavailable = "postgres_unavailable",
    /// The PostgreSQL URL does not parse (`validation`, config).
    PostgresUrl = "postgres_url",
    /// A managed execution's preparation deadline passed before dispatch (`expired`, nothing sent).
    PreparationDeadline = "preparation_deadline",
    /// A resolve-as-absent found the machine still present on the worker (`identity_conflict`).
    Present = "present",
    /// The spec's profile revision is below its worker's allocation floor, so nothing is stored (`unsupported_capability`).
    ProfileBelowFloor = "profile_below_floor",
    /// A stored spec's budgets exceed its version profile's (`validation`, store write).
    ProfileBudget = "profile_budget",
    /// A catalog profile revision's id is not an identifier of at most 128 bytes (`validation`, config).
    ProfileId = "profile_id",
    /// No configured worker's catalog holds the spec's exact profile revision with its budgets, so nothing is stored (`unsupported_capability`).
    ProfileNotInCatalog = "profile_not_in_catalog",
    /// A version profile's per-direction file budget is 0 or above the maximum (`validation`, config).
    ProfilePerDirectionOutOfRange = "profile_per_direction_out_of_range",
    /// A version profile's per-file size is 0 or above the file allowance maximum (`validation`, config).
    ProfilePerFileOutOfRange = "profile_per_file_out_of_range",
    /// A catalog profile revision has a field outside its range of C12.3 (`validation`, config).
    ProfileRange = "profile_range",
    /// A terminal's program is empty or longer than the limit (`validation`).
    ProgramLength = "program_length",
    /// A terminal's program contains a NUL byte (`validation`).
    ProgramNul = "program_nul",
    /// A stored row's projected columns disagree with its sealed record (`store`).
    ProjectionMismatch = "projection_mismatch",
    /// A stored spec's queue budget is outside 1–86,400,000 ms (`validation`, store write).
    QueueBudget = "queue_budget",
    /// An execution's queue deadline passed before it could be dispatched (`expired`, nothing sent).
    QueueDeadline = "queue_deadline",
    /// A read from the connection failed (`transport`).
    ReadFailed = "read_failed",
    /// A WebSocket client was told it consumed more input than it was offered (`validation`).
    ReadPastInputBuffer = "read_past_input_buffer",
    /// The worker's `/readyz` reply has a body where none is allowed (`protocol`).
    ReadyzBodyNotEmpty = "readyz_body_not_empty",
    /// The endpoint's receive idle timeout is outside its allowed range (`validation`, config).
    ReceiveIdleOutOfRange = "receive_idle_out_of_range",
    /// A record to be written breaks a record invariant (`store`, envelope).
    RecordInvalid = "record_invalid",
    /// A stored envelope holds another record kind than the one asked for (`store`).
    RecordKindMismatch = "record_kind_mismatch",
    /// The execution is recorded on another worker than the one the CLI uses (`validation`, CLI).
    RecordOnAnotherWorker = "record_on_another_worker",
    /// A record read back before dispatch after this controller saw it past
    /// `ready` (a rolled-back row): it is never dispatched from that read.
    RecordWentBack = "record_went_back",
    /// The worker answered with a 3xx redirect (`protocol`).
    Redirect = "redirect",
    /// The worker's framework refused the request body as too large (`protocol`).
    RejectedBodyTooLarge = "rejected_body_too_large",
    /// The worker's framework refused the request JSON as unprocessable (`protocol`).
    RejectedJsonShape = "rejected_json_shape",
    /// The worker's framework refused the request body as invalid JSON (`protocol`).
    RejectedJsonSyntax = "rejected_json_syntax",
    /// The worker's framework refused the request's media type (`protocol`).
    RejectedMediaType = "rejected_media_type",
    /// The worker's framework refused the request's query string (`protocol`).
    RejectedQuery = "rejected_query",
    /// The worker's framework refused the WebSocket upgrade request (`protocol`).
    RejectedUpgrade = "rejected_upgrade",
    /// A reservation was to be released before cleanup completed with the machine's absence recorded (`validation`, store).
    ReleaseBeforeAbsence = "release_before_absence",
    /// A machine created from a checkpoint is not reported `created` and branchable (`protocol`).
    ReplyCheckpointNotBranchable = "reply_checkpoint_not_branchable",
    /// The store applied a write but its reply was lost (`store`; raised by the simulated store).
    ReplyLost = "reply_lost",
    /// A machine operation's reply does not match the state it asked for (`protocol`).
    ReplyMismatch = "reply_mismatch",
    /// The worker's machine has other mounts than the spec (`protocol`).
    ReplyMountsMismatch = "reply_mounts_mismatch",
    /// The worker's reply names another machine than the one asked for (`identity_conflict`).
    ReplyNameMismatch = "reply_name_mismatch",
    /// The worker's machine has another network policy than the spec (`protocol`).
    ReplyNetworkMismatch = "reply_network_mismatch",
    /// The worker's machine has other port mappings than the spec (`protocol`).
    ReplyPortsMismatch = "reply_ports_mismatch",
    /// The worker's machine has other CPU, memory or disk sizes than the spec (`protocol`).
    ReplyResourcesMismatch = "reply_resources_mismatch",
    /// A request body is larger than the HTTP client's request limit (`validation`, nothing sent).
    RequestBody = "request_body",
    /// An upload's request body is larger than the endpoint's request limit (`validation`, nothing sent).
    RequestBodyTooLarge = "request_body_too_large",
    /// The client's request limit is below the version profile's per-file size (`validation`, config).
    RequestCapBelowPerFile = "request_cap_below_per_file",
    /// A slot request names no machine operation (`validation`).
    RequestNone = "request_none",
    /// An HTTP request target does not start with `/` or holds a byte that is not visible ASCII (`validation`).
    RequestTarget = "request_target",
    /// A WebSocket frame uses a reserved opcode (`protocol`).
    ReservedOpcode = "reserved_opcode",
    /// A machine record's reserved ports are not sorted unique or include 0 (`validation`, store write).
    ReservedPorts = "reserved_ports",
    /// An `http://` host name resolved to an address that is not loopback (`transport`, nothing sent).
    ResolvedNotLoopback = "resolved_not_loopback",
    /// A response body is larger than the response limit (`output_limit`).
    ResponseBody = "response_body",
    /// The client's response limit is below the version profile's per-file size (`validation`, config).
    ResponseCapBelowPerFile = "response_cap_below_per_file",
    /// A workload asks for a restart policy other than `never` (`unsupported_capability`).
    RestartPolicyUnsupported = "restart_policy_unsupported",
    /// A record holds a result in a state that has none, or lacks one where it is required (`validation`, store write).
    ResultState = "result_state",
    /// A patch tried to change a record's already-set result (`validation`, store write).
    ResultWriteOnce = "result_write_once",
    /// A submit names a retained machine and the runtime has no catalog for them (`unsupported_capability`).
    RetainedMachines = "retained_machines",
    /// A stored spec's retention is outside 60,000–2,592,000,000 ms (`validation`, store write).
    Retention = "retention",
    /// A row read earlier in the same store transaction is no longer there (`store`).
    RowVanished = "row_vanished",
    /// A terminal spec's row count is 0 (`validation`).
    RowsOutOfRange = "rows_out_of_range",
    /// A WebSocket frame has reserved bits set (`protocol`).
    RsvBitsSet = "rsv_bits_set",
    /// A resolve-as-stopped found the machine still running on the worker (`identity_conflict`).
    Running = "running",
    /// A call was made on a managed runtime whose driver has stopped (`unknown`).
    RuntimeStopped = "runtime_stopped",
    /// A record carries another schema number than this build writes (`validation`, store write).
    Schema = "schema",
    /// The SQLite store has no layout version recorded (`store`).
    SchemaMissing = "schema_missing",
    /// Sealing a record with the store key failed (`store`).
    Seal = "seal",
    /// A sealed record is shorter than its header or longer than the largest payload (`store`).
    SealedLength = "sealed_length",
    /// A streamed exec's reply sent a second exit event (`protocol`).
    SecondExit = "second_exit",
    /// A WebSocket send would overflow the pending-transmit buffer (`admission_exhausted`).
    SendBufferFull = "send_buffer_full",
    /// A terminal session ran past its session budget (`expired`).
    SessionBudget = "session_budget",
    /// A terminal spec's session budget is outside its allowed range (`validation`).
    SessionBudgetOutOfRange = "session_budget_out_of_range",
    /// A terminal send was asked after the session ended or its close was sent (`validation`).
    SessionClosed = "session_closed",
    /// A managed terminal's session budget is above the profile's execution budget (`validation`).
    SessionOverBudget = "session_over_budget",
    /// A file's SHA-256 differs from the one expected (`validation`, CLI).
    Sha256Mismatch = "sha256_mismatch",
    /// A submit was refused because the controller is shutting down (`admission_exhausted`).
    ShuttingDown = "shutting_down",
    /// A terminal resize gives 0 columns or rows (`validation`).
    SizeOutOfRange = "size_out_of_range",
    /// A retained machine's command slot is held by another execution (`admission_exhausted`).
    SlotBusy = "slot_busy",
    /// A retained machine's slot was kept without a result or error for the command (`unknown`).
    SlotKept = "slot_kept",
    /// The worker socket's directory is writable by group or others (`validation`, config).
    SocketDirWritableByOthers = "socket_dir_writable_by_others",
    /// The configured worker socket path is not a Unix socket (`validation`, config).
    SocketNotASocket = "socket_not_a_socket",
    /// The worker socket is owned by another user than its directory or root (`validation`, config).
    SocketOwnerMismatch = "socket_owner_mismatch",
    /// A Unix socket was configured with an `https://` base URL (`validation`, config).
    SocketRequiresPlainHttp = "socket_requires_plain_http",
    /// The worker socket is writable by others (`validation`, config).
    SocketWritableByOthers = "socket_writable_by_others",
    /// SQLite reported an error not classified otherwise (`store`).
    Sqlite = "sqlite",
    /// The SQLite database stayed busy or locked past the busy timeout (`store`).
    SqliteBusy = "sqlite_busy",
    /// The SQLite database file cannot be opened or created (`store`).
    SqliteCannotOpen = "sqlite_cannot_open",
    /// SQLite refused a write on a constraint (`store`).
    SqliteConstraint = "sqlite_constraint",
    /// The SQLite file is corrupt or not a database (`store`).
    SqliteCorrupt = "sqlite_corrupt",
    /// SQLite reported the disk full (`store`).
    SqliteDiskFull = "sqlite_disk_full",
    /// SQLite reported an I/O failure (`store`).
    SqliteIo = "sqlite_io",
    /// The SQLite file's permissions could not be restricted to the owner (`store`).
    SqlitePermissions = "sqlite_permissions",
    /// The SQLite database is read-only (`store`).
    SqliteReadOnly = "sqlite_read_only",
    /// One input chunk given to the SSE decoder is larger than its chunk limit (`output_limit`).
    SseChunkTooLarge = "sse_chunk_too_large",
    /// An SSE event's data is larger than the event limit (`output_limit`).
    SseEventTooLarge = "sse_event_too_large",
    /// The SSE decoder was given input after its end of stream (`validation`).
    SseInputAfterFinish = "sse_input_after_finish",
    /// An SSE line is longer than the line limit (`output_limit`).
    SseLineTooLong = "sse_line_too_long",
    /// A machine request reached a stage that does not fit its kind (`protocol`).
    Stage = "stage",
    /// A staged input read back from the guest differs from its declared size or digest (`protocol`, nothing dispatched).
    StagedInputMismatch = "staged_input_mismatch",
    /// A resumed preparation's input uploads may have been sent by another controller; never resent (`unknown`, nothing dispatched).
    StagingUncertain = "staging_uncertain",
    /// A start call answered with something other than the started machine (`protocol`).
    StartReplyMismatch = "start_reply_mismatch",
    /// A disposable machine's start may have reached the worker but its result is not known (`unknown`).
    StartUncertain = "start_uncertain",
    /// A response status is outside 100–599 (`protocol`).
    StatusCode = "status_code",
    /// A stored command's stdin is not valid base64 (`validation`).
    StdinEncoding = "stdin_encoding",
    /// The CLI's stdin file is not valid UTF-8 (`validation`, CLI).
    StdinNotUtf8 = "stdin_not_utf8",
    /// A command's stdin is longer than the limit (`validation`).
    StdinTooLong = "stdin_too_long",
    /// The CLI was given both `--stdin` and `--stream` (`validation`, CLI).
    StdinWithStream = "stdin_with_stream",
    /// A step write has no patches or more than the maximum (`validation`, store write).
    Steps = "steps",
    /// A machine spec's storage size is outside the allowed range (`validation`).
    StorageOutOfRange = "storage_out_of_range",
    /// The store lacks a capability the record or operation needs (`unsupported_capability`, nothing sent).
    StoreCapability = "store_capability",
    /// A managed runtime was built over a non-durable store without opting in to an ephemeral one (`validation`, config).
    StoreNotDurable = "store_not_durable",
    /// The tokio shell's blocking store task ended without an answer (`store`).
    StoreTaskLost = "store_task_lost",
    /// The blocking shell's store op ended without an answer (it panicked; `store`, outcome unknown, never read as absence).
    StoreThreadLost = "store_thread_lost",
    /// The CLI's exec stream ended without an exit event (`unknown`, CLI).
    StreamEndedWithoutExit = "stream_ended_without_exit",
    /// A streamed exec was asked for a background command (`unsupported_capability`, nothing sent).
    StreamWithBackground = "stream_with_background",
    /// A streamed exec was asked with stdin (`unsupported_capability`, nothing sent).
    StreamWithStdin = "stream_with_stdin",
    /// A caller of this runtime already streams this execution's output.
    StreamKeyTaken = "stream_key_taken",
    /// The runtime already forwards as many streamed executions as it may.
    StreamsExhausted = "streams_exhausted",
    /// A logs request's tail count is above the maximum (`validation`).
    TailOutOfRange = "tail_out_of_range",
    /// The controller's telemetry queue limit is outside its allowed range (`validation`, config).
    TelemetryPending = "telemetry_pending",
    /// A submit of a terminal reached a runtime that does not run terminals here (`unsupported_capability`).
    Terminal = "terminal",
    /// A managed terminal was opened twice for the same key on this runtime (`validation`).
    TerminalAlreadyRegistered = "terminal_already_registered",
    /// A managed terminal's artifact is not an image (`validation`).
    TerminalCheckpointSource = "terminal_checkpoint_source",
    /// A managed terminal's consumer slot expired before it was taken (`expired`).
    TerminalConsumer = "terminal_consumer",
    /// A managed terminal is already bound to another consumer (`authentication`, nothing sent).
    TerminalConsumerBound = "terminal_consumer_bound",
    /// A managed terminal spec lists input or output files (`validation`).
    TerminalFileManifest = "terminal_file_manifest",
    /// The managed terminal registry's limit is outside 1–64 (`validation`), or all its places are taken (`admission_exhausted`).
    TerminalLimit = "terminal_limit",
    /// A terminal message answered a machine operation (`protocol`; raised by the simulation).
    TerminalMessageOnAnOp = "terminal_message_on_an_op",
    /// A managed terminal spec names no retained machine (`validation`).
    TerminalNeedsRetainedMachine = "terminal_needs_retained_machine",
    /// `attach` found no live connection of the terminal on this runtime (`not_found`, nothing sent).
    TerminalNotLiveHere = "terminal_not_live_here",
    /// A recovered terminal may have been dispatched before the restart; its outcome is unknown (`unknown`).
    TerminalRecovered = "terminal_recovered",
    /// The managed terminal's entry is gone from the registry (`not_found`).
    TerminalRetired = "terminal_retired",
    /// A managed terminal's session budget ran out before it was dispatched (`expired`, nothing sent).
    TerminalSession = "terminal_session",
    /// A call was made on a managed terminal whose task has ended (`unknown`).
    TerminalTaskEnded = "terminal_task_ended",
    /// `wait` on a managed terminal ran out while this runtime still drives the run (`expired`).
    TerminalWait = "terminal_wait",
    /// A terminal sent a text frame after its exit frame (`protocol`).
    TextAfterExit = "text_after_exit",
    /// A terminal text frame is longer than the exit-frame limit (`protocol`).
    TextFrameTooLong = "text_frame_too_long",
    /// The blocking shell could not start a thread (`unknown`, nothing sent).
    ThreadSpawn = "thread_spawn",
    /// The simulated worker timed out the call (`transport`; raised by the simulation).
    Timeout = "timeout",
    /// A command's or logs request's timeout is outside its allowed range (`validation`).
    TimeoutOutOfRange = "timeout_out_of_range",
    /// A command's timeout is longer than the profile's execution budget (`validation`).
    TimeoutOverBudget = "timeout_over_budget",
    /// A stored command's timeout does not fit in 32 bits (`validation`).
    TimeoutRange = "timeout_range",
    /// A stored timestamp is above the largest accepted time (`validation`, store write).
    Timestamp = "timestamp",
    /// The TLS CA file cannot be read, holds no certificate or a bad one (`validation`, config).
    TlsCaFile = "tls_ca_file",
    /// The TLS client certificate file cannot be read or holds no certificate (`validation`, config).
    TlsClientCert = "tls_client_cert",
    /// The TLS client key file cannot be read or does not fit the certificate (`validation`, config).
    TlsClientKey = "tls_client_key",
    /// The TLS handshake with the worker failed (`transport`, nothing sent).
    TlsHandshake = "tls_handshake",
    /// The TLS provider could not be set up with safe protocol versions (`validation`, config).
    TlsProvider = "tls_provider",
    /// An `https://` endpoint has neither a CA file nor system roots to trust (`unsupported_capability`, config).
    TlsRequiresCaFile = "tls_requires_ca_file",
    /// The worker host is not a valid TLS server name (`validation`, config).
    TlsServerName = "tls_server_name",
    /// System trust roots were asked for but the platform store gave no usable certificate (`validation`, config).
    TlsSystemRoots = "tls_system_roots",
    /// A record has more artifacts than the limit (`validation`, store write).
    TooManyArtifacts = "too_many_artifacts",
    /// A network policy lists more CIDRs than the limit (`validation`).
    TooManyCidrs = "too_many_cidrs",
    /// A workload has more environment variables than the limit (`validation`).
    TooManyEnv = "too_many_env",
    /// A stored spec lists more input or output files than the limit (`validation`, store write).
    TooManyFiles = "too_many_files",
    /// The WebSocket upgrade reply has more header fields than the limit (`protocol`).
    TooManyHeaders = "too_many_headers",
    /// A network policy lists more hostnames than the limit (`validation`).
    TooManyHostnames = "too_many_hostnames",
    /// A stored spec has more metadata entries than the limit (`validation`, store write).
    TooManyMetadata = "too_many_metadata",
    /// A machine spec has more mounts than the limit (`validation`).
    TooManyMounts = "too_many_mounts",
    /// A spec has more port mappings than the worker's create accepts (`validation`).
    TooManyPorts = "too_many_ports",
    /// A file policy lists more roots than the limit (`validation`).
    TooManyRoots = "too_many_roots",
    /// The controller configuration lists more workers than the limit (`validation`, config).
    TooManyWorkers = "too_many_workers",
    /// A workload's entrypoint and cmd together have more arguments than the limit (`validation`).
    TooManyWorkloadArgs = "too_many_workload_args",
    /// A chunked response's trailer is larger than the trailer limit (`output_limit`).
    TrailerBytes = "trailer_bytes",
    /// A response's `Transfer-Encoding` is anything but a single `chunked` (`protocol`).
    TransferEncoding = "transfer_encoding",
    /// The endpoint's transport plan is one this shell cannot connect (`unsupported_capability`, config).
    TransportNotSupported = "transport_not_supported",
    /// The connection ended before the response body was complete (`transport`, dispatch uncertain).
    Truncated = "truncated",
    /// A claim or lease TTL is outside its allowed range (`validation`, store claim).
    Ttl = "ttl",
    /// A stored spec names both a managed machine and a worker machine (`validation`, store write).
    TwoMachines = "two_machines",
    /// The worker answered 401 Unauthorized (`authentication`).
    Unauthorized = "unauthorized",
    /// The store is unavailable (`store`; raised by the simulated store).
    Unavailable = "unavailable",
    /// A machine request got another kind of answer than the one it asked for (`protocol`).
    UnexpectedAnswer = "unexpected_answer",
    /// A worker reply's media type is not the one the call expects (`protocol`).
    UnexpectedMediaType = "unexpected_media_type",
    /// The store or worker answered a request with a reply of another kind (`protocol`).
    UnexpectedReply = "unexpected_reply",
    /// The worker answered with a status the call does not expect (`protocol`).
    UnexpectedStatus = "unexpected_status",
    /// A terminal text frame is not a valid exit frame (`protocol`).
    UnexpectedTextFrame = "unexpected_text_frame",
    /// A stored envelope has a version this build does not know (`store`).
    UnknownEnvelopeVersion = "unknown_envelope_version",
    /// A sealed record names a key id this build does not know (`store`).
    UnknownKeyId = "unknown_key_id",
    /// The SQLite store's layout version is newer than this build knows (`store`).
    UnknownLayoutVersion = "unknown_layout_version",
    /// A stored envelope's record-kind tag is unknown (`store`).
    UnknownRecordKind = "unknown_record_kind",
    /// A sealed record has a format version this build does not know (`store`).
    UnknownSealedVersion = "unknown_sealed_version",
    /// The operation names a worker id this runtime or controller has no client for.
    UnknownWorker = "unknown_worker",
    /// The worker reports a version with no known profile and none supplied (`unsupported_capability`, nothing sent).
    UnknownWorkerVersion = "unknown_worker_version",
    /// A managed terminal's unread output exceeds its byte or chunk limit (`output_limit`).
    UnreadOutput = "unread_output",
    /// A terminal's unread output bytes exceed the output queue limit (`output_limit`).
    UnreadOutputBytes = "unread_output_bytes",
    /// A terminal's unread output chunks exceed the chunk limit (`output_limit`).
    UnreadOutputChunks = "unread_output_chunks",
    /// The WebSocket upgrade reply accepts an extension that was not asked for (`protocol`).
    UnrequestedExtension = "unrequested_extension",
    /// The WebSocket upgrade reply names a subprotocol that was not asked for (`protocol`).
    UnrequestedSubprotocol = "unrequested_subprotocol",
    /// A volume-create body could not be serialised (`validation`).
    UnserializableBody = "unserializable_body",
    /// A record's update time is before its acceptance time (`validation`, store write).
    UpdatedBeforeAccepted = "updated_before_accepted",
    /// The WebSocket upgrade reply lacks exactly one `Upgrade` header (`protocol`).
    UpgradeHeader = "upgrade_header",
    /// The WebSocket upgrade reply's `Upgrade` header does not name `websocket` (`protocol`).
    UpgradeNotWebsocket = "upgrade_not_websocket",
    /// The worker refused the WebSocket upgrade with 401 or 403 (`authentication`).
    UpgradeRefused = "upgrade_refused",
    /// The worker's upload reply names another path or size than was sent (`protocol`).
    UploadReplyMismatch = "upload_reply_mismatch",
    /// The PostgreSQL store's usage row for the worker is missing (`store`).
    UsageMissing = "usage_missing",
    /// A stored command's user is empty or longer than the limit (`validation`, store write).
    User = "user",
    /// The HTTP client's `User-Agent` holds a byte not allowed in a header field (`validation`, config).
    UserAgent = "user_agent",
    /// A command's user is the empty string (`validation`).
    UserEmpty = "user_empty",
    /// A command's user is longer than the limit (`validation`).
    UserTooLong = "user_too_long",
    /// Verifying a machine's state after an operation failed before it could be read (`unknown`).
    VerifyFailed = "verify_failed",
    /// A record's version or generation is 0 where not allowed or above the maximum (`validation`, store write).
    Version = "version",
    /// A compare-and-swap write named another version than the record's (`stale_version`), or a sealed record's bound version differs (`store`).
    VersionMismatch = "version_mismatch",
    /// The worker's 204 reply to a volume delete has a body (`protocol`).
    VolumeDeleteBodyNotEmpty = "volume_delete_body_not_empty",
    /// The worker answered a volume delete with 200 or 404 instead of 204 (`protocol`).
    VolumeDeleteNotConfirmed = "volume_delete_not_confirmed",
    /// A volume size is outside the allowed range (`validation`).
    VolumeSizeOutOfRange = "volume_size_out_of_range",
    /// A terminal read's wait is longer than the maximum (`validation`).
    WaitOutOfRange = "wait_out_of_range",
    /// A wait on an execution ran out before its end (`expired`).
    WaitTimeout = "wait_timeout",
    /// A command's request body could not be serialised (`validation`).
    WireBody = "wire_body",
    /// A command's workdir has an empty, `.` or `..` segment (`validation`).
    WorkdirBadSegment = "workdir_bad_segment",
    /// A command's workdir contains NUL, `%` or `\` (`validation`).
    WorkdirForbiddenByte = "workdir_forbidden_byte",
    /// A command's workdir does not start with `/` (`validation`).
    WorkdirNotAbsolute = "workdir_not_absolute",
    /// A command's workdir is longer than the limit (`validation`).
    WorkdirTooLong = "workdir_too_long",
    /// The worker's handler answered "bad request" (`protocol`).
    WorkerBadRequest = "worker_bad_request",
    /// The worker's reserved capacity plus this machine would exceed its limit (`admission_exhausted`).
    WorkerCapacity = "worker_capacity",
    /// Every worker whose catalog could run the spec is marked draining, so nothing is stored (`unsupported_capability`).
    WorkerDraining = "worker_draining",
    /// The worker's handler answered with an error code not classified otherwise (`protocol`).
    WorkerError = "worker_error",
    /// A streamed exec's reply sent an `error` event (`protocol`).
    WorkerErrorEvent = "worker_error_event",
    /// The worker answered an error with plain text rather than its JSON error (`protocol`).
    WorkerErrorText = "worker_error_text",
    /// A record's worker-lease generation is 0 (`validation`) or no longer the live lease's (`stale_claim`).
    WorkerGeneration = "worker_generation",
    /// A worker id in the controller configuration is not valid (`validation`, config).
    WorkerId = "worker_id",
    /// The worker's handler answered "internal error" (`protocol`).
    WorkerInternalError = "worker_internal_error",
    /// The caller does not hold the live worker lease the write needs (`stale_claim`).
    WorkerLease = "worker_lease",
    /// A streamed exec's reply sent the worker's own output-cap error (`output_limit`).
    WorkerOutputCap = "worker_output_cap",
    /// The worker answered 408 Request Timeout, so the request's effect is unknown (`unknown`).
    WorkerRequestTimeout = "worker_request_timeout",
    /// The worker's framework reported its runtime stalled (`protocol`).
    WorkerRuntimeStalled = "worker_runtime_stalled",
    /// The worker's handler answered "unavailable" (`protocol`).
    WorkerUnavailable = "worker_unavailable",
    /// A workload's arguments together are longer than the limit (`validation`).
    WorkloadArgsTooLong = "workload_args_too_long",
    /// A workload was given for a machine whose source is not an image (`validation`).
    WorkloadRequiresImageSource = "workload_requires_image_source",
    /// A write to the connection failed (`transport`).
    WriteFailed = "write_failed",
    /// A write to the connection stalled past the write wait (`transport`).
    WriteTimeout = "write_timeout",
    /// A terminal's write wait is zero or above the maximum (`validation`).
    WriteWaitOutOfRange = "write_wait_out_of_range",
}

impl Reason {
    /// The reason whose code is `code`; `None` for a code this build does not
    /// know (a stored record from another version) and for the empty code.
    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.as_str() == code)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed::record::MAX_REASON_LEN;

    #[test]
    fn codes_are_unique_short_snake_case_and_round_trip() {
        let mut codes: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        for code in &codes {
            assert!(!code.is_empty() && code.len() <= MAX_REASON_LEN, "{code}");
            assert!(code.as_bytes()[0].is_ascii_lowercase(), "{code}");
            assert!(
                code.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{code}"
            );
            assert!(!code.contains("__") && !code.ends_with('_'), "{code}");
        }
        for r in Reason::ALL {
            assert_eq!(Reason::from_code(r.as_str()), Some(*r));
        }
        let n = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), n, "two reasons share a code");
        assert_eq!(Reason::Unspecified.as_str(), "");
        assert_eq!(Reason::from_code(""), None);
        assert_eq!(Reason::from_code("no_such_code_anywhere"), None);
    }

    /// Every reason says when it is produced: no doc is the code read back
    /// as words (the old placeholder), each is a sentence of some length.
    #[test]
    fn every_reason_has_a_real_one_line_doc() {
        assert_eq!(Reason::DOCS.len(), Reason::ALL.len());
        for (r, doc) in Reason::ALL.iter().zip(Reason::DOCS) {
            let doc = doc.trim();
            let code = r.as_str().replace('_', " ");
            let placeholder = format!("{}{}.", code[..1].to_ascii_uppercase(), &code[1..]);
            assert_ne!(doc, placeholder, "{r:?} has a placeholder doc");
            assert!(doc.ends_with('.') || doc.ends_with(')'), "{r:?}: {doc}");
            assert!(doc.split_whitespace().count() >= 5, "{r:?}: {doc}");
            assert!(!doc.contains('\n'), "{r:?}: one line");
        }
    }
}
