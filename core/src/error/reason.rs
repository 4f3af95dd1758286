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
    /// Abnormal close.
    AbnormalClose = "abnormal_close",
    /// Absence write once.
    AbsenceWriteOnce = "absence_write_once",
    /// Absent.
    Absent = "absent",
    /// Accept.
    Accept = "accept",
    /// Accept mismatch.
    AcceptMismatch = "accept_mismatch",
    /// Active execution missing.
    ActiveExecutionMissing = "active_execution_missing",
    /// Active execution state.
    ActiveExecutionState = "active_execution_state",
    /// Allowance out of range.
    AllowanceOutOfRange = "allowance_out_of_range",
    /// Already assigned.
    AlreadyAssigned = "already_assigned",
    /// Already deleted.
    AlreadyDeleted = "already_deleted",
    /// Already exists.
    AlreadyExists = "already_exists",
    /// Ambiguous exit code.
    AmbiguousExitCode = "ambiguous_exit_code",
    /// Architecture.
    Architecture = "architecture",
    /// Argv empty.
    ArgvEmpty = "argv_empty",
    /// Argv entry too long.
    ArgvEntryTooLong = "argv_entry_too_long",
    /// Argv first empty.
    ArgvFirstEmpty = "argv_first_empty",
    /// Argv nul.
    ArgvNul = "argv_nul",
    /// Argv too many.
    ArgvTooMany = "argv_too_many",
    /// Argv total too long.
    ArgvTotalTooLong = "argv_total_too_long",
    /// Artifact size.
    ArtifactSize = "artifact_size",
    /// Artifact undeclared.
    ArtifactUndeclared = "artifact_undeclared",
    /// Artifacts not sorted unique.
    ArtifactsNotSortedUnique = "artifacts_not_sorted_unique",
    /// Attach wait.
    AttachWait = "attach_wait",
    /// Attach wait out of range.
    AttachWaitOutOfRange = "attach_wait_out_of_range",
    /// Authentication failed.
    AuthenticationFailed = "authentication_failed",
    /// Background.
    Background = "background",
    /// Background with stdin.
    BackgroundWithStdin = "background_with_stdin",
    /// Background with timeout.
    BackgroundWithTimeout = "background_with_timeout",
    /// Base url host.
    BaseUrlHost = "base_url_host",
    /// Base url path.
    BaseUrlPath = "base_url_path",
    /// Base url port.
    BaseUrlPort = "base_url_port",
    /// Base url query or fragment.
    BaseUrlQueryOrFragment = "base_url_query_or_fragment",
    /// Base url scheme.
    BaseUrlScheme = "base_url_scheme",
    /// Base url too long.
    BaseUrlTooLong = "base_url_too_long",
    /// Base url userinfo.
    BaseUrlUserinfo = "base_url_userinfo",
    /// Bearer token.
    BearerToken = "bearer_token",
    /// Body before head.
    BodyBeforeHead = "body_before_head",
    /// Buffer out of range.
    BufferOutOfRange = "buffer_out_of_range",
    /// Buffer over allowance.
    BufferOverAllowance = "buffer_over_allowance",
    /// Ca file requires https.
    CaFileRequiresHttps = "ca_file_requires_https",
    /// Callback deadline.
    CallbackDeadline = "callback_deadline",
    /// Callback thread spawn.
    CallbackThreadSpawn = "callback_thread_spawn",
    /// Callback threads exhausted.
    CallbackThreadsExhausted = "callback_threads_exhausted",
    /// Cancel requested.
    CancelRequested = "cancel_requested",
    /// Capacity boot id too long.
    CapacityBootIdTooLong = "capacity_boot_id_too_long",
    /// Capacity used cpus invalid.
    CapacityUsedCpusInvalid = "capacity_used_cpus_invalid",
    /// Changed spec.
    ChangedSpec = "changed_spec",
    /// Checkpoint source restrictions.
    CheckpointSourceRestrictions = "checkpoint_source_restrictions",
    /// Chunk extension.
    ChunkExtension = "chunk_extension",
    /// Chunk missing crlf.
    ChunkMissingCrlf = "chunk_missing_crlf",
    /// Chunk size.
    ChunkSize = "chunk_size",
    /// Chunk size overflow.
    ChunkSizeOverflow = "chunk_size_overflow",
    /// Claim expired.
    ClaimExpired = "claim_expired",
    /// Claim generation.
    ClaimGeneration = "claim_generation",
    /// Claim owner.
    ClaimOwner = "claim_owner",
    /// Cleanup attempts.
    CleanupAttempts = "cleanup_attempts",
    /// Cleanup attempts decrease.
    CleanupAttemptsDecrease = "cleanup_attempts_decrease",
    /// Cleanup complete permanent.
    CleanupCompletePermanent = "cleanup_complete_permanent",
    /// Cleanup deadline.
    CleanupDeadline = "cleanup_deadline",
    /// Cleanup state.
    CleanupState = "cleanup_state",
    /// Cleanup without absence.
    CleanupWithoutAbsence = "cleanup_without_absence",
    /// Client allowance below profile.
    ClientAllowanceBelowProfile = "client_allowance_below_profile",
    /// Client cert and key go together.
    ClientCertAndKeyGoTogether = "client_cert_and_key_go_together",
    /// Client cert requires https.
    ClientCertRequiresHttps = "client_cert_requires_https",
    /// Clock before updated at.
    ClockBeforeUpdatedAt = "clock_before_updated_at",
    /// Close code invalid.
    CloseCodeInvalid = "close_code_invalid",
    /// Close code not sendable.
    CloseCodeNotSendable = "close_code_not_sendable",
    /// Close payload one byte.
    ClosePayloadOneByte = "close_payload_one_byte",
    /// Close reason too long.
    CloseReasonTooLong = "close_reason_too_long",
    /// Close wait expired.
    CloseWaitExpired = "close_wait_expired",
    /// Close wait out of range.
    CloseWaitOutOfRange = "close_wait_out_of_range",
    /// Closed.
    Closed = "closed",
    /// Closed before open.
    ClosedBeforeOpen = "closed_before_open",
    /// Closed by cancel.
    ClosedByCancel = "closed_by_cancel",
    /// Closed by client.
    ClosedByClient = "closed_by_client",
    /// Closed without exit.
    ClosedWithoutExit = "closed_without_exit",
    /// Collection state.
    CollectionState = "collection_state",
    /// Cols out of range.
    ColsOutOfRange = "cols_out_of_range",
    /// Command active.
    CommandActive = "command_active",
    /// Command machine mismatch.
    CommandMachineMismatch = "command_machine_mismatch",
    /// Command mismatch.
    CommandMismatch = "command_mismatch",
    /// Conflict.
    Conflict = "conflict",
    /// Connect failed.
    ConnectFailed = "connect_failed",
    /// Connect timeout.
    ConnectTimeout = "connect_timeout",
    /// Connect timeout out of range.
    ConnectTimeoutOutOfRange = "connect_timeout_out_of_range",
    /// Connection closed.
    ConnectionClosed = "connection_closed",
    /// Connection header.
    ConnectionHeader = "connection_header",
    /// Connection refused.
    ConnectionRefused = "connection_refused",
    /// Connection reset.
    ConnectionReset = "connection_reset",
    /// Consumer lost.
    ConsumerLost = "consumer_lost",
    /// Content encoding.
    ContentEncoding = "content_encoding",
    /// Content length.
    ContentLength = "content_length",
    /// Content length and transfer encoding.
    ContentLengthAndTransferEncoding = "content_length_and_transfer_encoding",
    /// Content type.
    ContentType = "content_type",
    /// Continuation without start.
    ContinuationWithoutStart = "continuation_without_start",
    /// Control frame too long.
    ControlFrameTooLong = "control_frame_too_long",
    /// Corrupt assignment.
    CorruptAssignment = "corrupt_assignment",
    /// Corrupt lease.
    CorruptLease = "corrupt_lease",
    /// Cp needs one local one remote.
    CpNeedsOneLocalOneRemote = "cp_needs_one_local_one_remote",
    /// Cpus out of range.
    CpusOutOfRange = "cpus_out_of_range",
    /// Create reply mismatch.
    CreateReplyMismatch = "create_reply_mismatch",
    /// Created at out of range.
    CreatedAtOutOfRange = "created_at_out_of_range",
    /// Creation evidence.
    CreationEvidence = "creation_evidence",
    /// Creation uncertain.
    CreationUncertain = "creation_uncertain",
    /// Creation write once.
    CreationWriteOnce = "creation_write_once",
    /// Cumulative input.
    CumulativeInput = "cumulative_input",
    /// Data frame inside fragmented message.
    DataFrameInsideFragmentedMessage = "data_frame_inside_fragmented_message",
    /// Deadline.
    Deadline = "deadline",
    /// Deadline set once.
    DeadlineSetOnce = "deadline_set_once",
    /// Deadline without operation.
    DeadlineWithoutOperation = "deadline_without_operation",
    /// Deleted name mismatch.
    DeletedNameMismatch = "deleted_name_mismatch",
    /// Deleted state.
    DeletedState = "deleted_state",
    /// Detach needs persistent worker.
    DetachNeedsPersistentWorker = "detach_needs_persistent_worker",
    /// Detached.
    Detached = "detached",
    /// Digest.
    Digest = "digest",
    /// Disposable machines.
    DisposableMachines = "disposable_machines",
    /// Download cap.
    DownloadCap = "download_cap",
    /// Download limit out of range.
    DownloadLimitOutOfRange = "download_limit_out_of_range",
    /// Drain stop intent.
    DrainStopIntent = "drain_stop_intent",
    /// Due limit.
    DueLimit = "due_limit",
    /// Duplicate content length.
    DuplicateContentLength = "duplicate_content_length",
    /// Duplicate content type.
    DuplicateContentType = "duplicate_content_type",
    /// Duplicate env name.
    DuplicateEnvName = "duplicate_env_name",
    /// Duplicate host port.
    DuplicateHostPort = "duplicate_host_port",
    /// Duplicate network entry.
    DuplicateNetworkEntry = "duplicate_network_entry",
    /// Duplicate worker.
    DuplicateWorker = "duplicate_worker",
    /// Early close.
    EarlyClose = "early_close",
    /// Empty argv.
    EmptyArgv = "empty_argv",
    /// Empty network policy.
    EmptyNetworkPolicy = "empty_network_policy",
    /// Empty workdir roots.
    EmptyWorkdirRoots = "empty_workdir_roots",
    /// Empty workload.
    EmptyWorkload = "empty_workload",
    /// Encode.
    Encode = "encode",
    /// Env name duplicate.
    EnvNameDuplicate = "env_name_duplicate",
    /// Env name invalid.
    EnvNameInvalid = "env_name_invalid",
    /// Env name too long.
    EnvNameTooLong = "env_name_too_long",
    /// Env not k equals v.
    EnvNotKEqualsV = "env_not_k_equals_v",
    /// Env too many.
    EnvTooMany = "env_too_many",
    /// Env value too long.
    EnvValueTooLong = "env_value_too_long",
    /// Envelope short.
    EnvelopeShort = "envelope_short",
    /// Eof during handshake.
    EofDuringHandshake = "eof_during_handshake",
    /// Eof inside frame.
    EofInsideFrame = "eof_inside_frame",
    /// Eof without exit.
    EofWithoutExit = "eof_without_exit",
    /// Error after exit.
    ErrorAfterExit = "error_after_exit",
    /// Error entry.
    ErrorEntry = "error_entry",
    /// Error history.
    ErrorHistory = "error_history",
    /// Evidence state.
    EvidenceState = "evidence_state",
    /// Exec reply base64.
    ExecReplyBase64 = "exec_reply_base64",
    /// Exec reply invalid.
    ExecReplyInvalid = "exec_reply_invalid",
    /// Exec user not in version.
    ExecUserNotInVersion = "exec_user_not_in_version",
    /// Execution deadline.
    ExecutionDeadline = "execution_deadline",
    /// Execution not finished.
    ExecutionNotFinished = "execution_not_finished",
    /// Execution not pending.
    ExecutionNotPending = "execution_not_pending",
    /// Exit code out of range.
    ExitCodeOutOfRange = "exit_code_out_of_range",
    /// Exit invalid.
    ExitInvalid = "exit_invalid",
    /// Feature beyond version.
    FeatureBeyondVersion = "feature_beyond_version",
    /// Feature not in version.
    FeatureNotInVersion = "feature_not_in_version",
    /// File allowance exceeded.
    FileAllowanceExceeded = "file_allowance_exceeded",
    /// File allowance out of range.
    FileAllowanceOutOfRange = "file_allowance_out_of_range",
    /// File not regular.
    FileNotRegular = "file_not_regular",
    /// File transfer.
    FileTransfer = "file_transfer",
    /// Files not sorted unique.
    FilesNotSortedUnique = "files_not_sorted_unique",
    /// Fingerprint differs.
    FingerprintDiffers = "fingerprint_differs",
    /// Fingerprint key mismatch.
    FingerprintKeyMismatch = "fingerprint_key_mismatch",
    /// Follow ended.
    FollowEnded = "follow_ended",
    /// Follow unsupported.
    FollowUnsupported = "follow_unsupported",
    /// Forbidden.
    Forbidden = "forbidden",
    /// Forbidden evidence.
    ForbiddenEvidence = "forbidden_evidence",
    /// Forbidden transition.
    ForbiddenTransition = "forbidden_transition",
    /// Fragmented control frame.
    FragmentedControlFrame = "fragmented_control_frame",
    /// Frame too large.
    FrameTooLarge = "frame_too_large",
    /// Generation exhausted.
    GenerationExhausted = "generation_exhausted",
    /// Handshake timeout.
    HandshakeTimeout = "handshake_timeout",
    /// Handshake timeout out of range.
    HandshakeTimeoutOutOfRange = "handshake_timeout_out_of_range",
    /// Handshake too large.
    HandshakeTooLarge = "handshake_too_large",
    /// Head bytes.
    HeadBytes = "head_bytes",
    /// Header count.
    HeaderCount = "header_count",
    /// Health running exceeds total.
    HealthRunningExceedsTotal = "health_running_exceeds_total",
    /// Health status not ok.
    HealthStatusNotOk = "health_status_not_ok",
    /// Health total out of range.
    HealthTotalOutOfRange = "health_total_out_of_range",
    /// Health version invalid.
    HealthVersionInvalid = "health_version_invalid",
    /// Held by other.
    HeldByOther = "held_by_other",
    /// History not empty.
    HistoryNotEmpty = "history_not_empty",
    /// Host.
    Host = "host",
    /// Host port taken.
    HostPortTaken = "host_port_taken",
    /// Http version.
    HttpVersion = "http_version",
    /// Https requires token.
    HttpsRequiresToken = "https_requires_token",
    /// Identifier.
    Identifier = "identifier",
    /// Identity mismatch.
    IdentityMismatch = "identity_mismatch",
    /// Idle budget.
    IdleBudget = "idle_budget",
    /// Idle budget out of range.
    IdleBudgetOutOfRange = "idle_budget_out_of_range",
    /// Idle timeout.
    IdleTimeout = "idle_timeout",
    /// Idle timeout out of range.
    IdleTimeoutOutOfRange = "idle_timeout_out_of_range",
    /// Incarnation changed.
    IncarnationChanged = "incarnation_changed",
    /// Incarnation mismatch.
    IncarnationMismatch = "incarnation_mismatch",
    /// Input chunk too large.
    InputChunkTooLarge = "input_chunk_too_large",
    /// Input limit out of range.
    InputLimitOutOfRange = "input_limit_out_of_range",
    /// Input not drained.
    InputNotDrained = "input_not_drained",
    /// Input size.
    InputSize = "input_size",
    /// Insecure with https.
    InsecureWithHttps = "insecure_with_https",
    /// Intent not mine.
    IntentNotMine = "intent_not_mine",
    /// Intent without claim.
    IntentWithoutClaim = "intent_without_claim",
    /// Invalid checkpoint path.
    InvalidCheckpointPath = "invalid_checkpoint_path",
    /// Invalid cidr.
    InvalidCidr = "invalid_cidr",
    /// Invalid env name.
    InvalidEnvName = "invalid_env_name",
    /// Invalid file path.
    InvalidFilePath = "invalid_file_path",
    /// Invalid guest path.
    InvalidGuestPath = "invalid_guest_path",
    /// Invalid host.
    InvalidHost = "invalid_host",
    /// Invalid hostname.
    InvalidHostname = "invalid_hostname",
    /// Invalid image path.
    InvalidImagePath = "invalid_image_path",
    /// Invalid json reply.
    InvalidJsonReply = "invalid_json_reply",
    /// Invalid machine json.
    InvalidMachineJson = "invalid_machine_json",
    /// Invalid machine name.
    InvalidMachineName = "invalid_machine_name",
    /// Invalid mount source.
    InvalidMountSource = "invalid_mount_source",
    /// Invalid mount target.
    InvalidMountTarget = "invalid_mount_target",
    /// Invalid namespace.
    InvalidNamespace = "invalid_namespace",
    /// Invalid oci reference.
    InvalidOciReference = "invalid_oci_reference",
    /// Invalid port.
    InvalidPort = "invalid_port",
    /// Invalid profile version.
    InvalidProfileVersion = "invalid_profile_version",
    /// Invalid registry reference.
    InvalidRegistryReference = "invalid_registry_reference",
    /// Invalid registry token.
    InvalidRegistryToken = "invalid_registry_token",
    /// Invalid sha256.
    InvalidSha256 = "invalid_sha256",
    /// Invalid socket path.
    InvalidSocketPath = "invalid_socket_path",
    /// Invalid target.
    InvalidTarget = "invalid_target",
    /// Invalid token.
    InvalidToken = "invalid_token",
    /// Invalid utf8.
    InvalidUtf8 = "invalid_utf8",
    /// Invalid volume id.
    InvalidVolumeId = "invalid_volume_id",
    /// Invalid worker id.
    InvalidWorkerId = "invalid_worker_id",
    /// Invalid workload arg.
    InvalidWorkloadArg = "invalid_workload_arg",
    /// Invalid workload workdir.
    InvalidWorkloadWorkdir = "invalid_workload_workdir",
    /// Key create.
    KeyCreate = "key_create",
    /// Key equals fingerprint key.
    KeyEqualsFingerprintKey = "key_equals_fingerprint_key",
    /// Key length.
    KeyLength = "key_length",
    /// Key mismatch.
    KeyMismatch = "key_mismatch",
    /// Key missing.
    KeyMissing = "key_missing",
    /// Key permissions.
    KeyPermissions = "key_permissions",
    /// Key random.
    KeyRandom = "key_random",
    /// Key read.
    KeyRead = "key_read",
    /// Key sync.
    KeySync = "key_sync",
    /// Key write.
    KeyWrite = "key_write",
    /// Launch ack shape.
    LaunchAckShape = "launch_ack_shape",
    /// Launch exit nonzero.
    LaunchExitNonzero = "launch_exit_nonzero",
    /// Launch pid range.
    LaunchPidRange = "launch_pid_range",
    /// Launch requires background.
    LaunchRequiresBackground = "launch_requires_background",
    /// Launch stderr.
    LaunchStderr = "launch_stderr",
    /// Launch without ack.
    LaunchWithoutAck = "launch_without_ack",
    /// Layout needs migration.
    LayoutNeedsMigration = "layout_needs_migration",
    /// Lease ttl.
    LeaseTtl = "lease_ttl",
    /// Lease ttl out of range.
    LeaseTtlOutOfRange = "lease_ttl_out_of_range",
    /// Legacy sealed version.
    LegacySealedVersion = "legacy_sealed_version",
    /// Length top bit set.
    LengthTopBitSet = "length_top_bit_set",
    /// Lifecycle action.
    LifecycleAction = "lifecycle_action",
    /// List limit.
    ListLimit = "list_limit",
    /// List too long.
    ListTooLong = "list_too_long",
    /// Log allowance.
    LogAllowance = "log_allowance",
    /// Log event cap.
    LogEventCap = "log_event_cap",
    /// Log line not utf8.
    LogLineNotUtf8 = "log_line_not_utf8",
    /// Log partial frame.
    LogPartialFrame = "log_partial_frame",
    /// Machine action needs a worker.
    MachineActionNeedsAWorker = "machine_action_needs_a_worker",
    /// Machine deleted.
    MachineDeleted = "machine_deleted",
    /// Machine gpu unsupported.
    MachineGpuUnsupported = "machine_gpu_unsupported",
    /// Machine mount staged.
    MachineMountStaged = "machine_mount_staged",
    /// Machine mount staged missing.
    MachineMountStagedMissing = "machine_mount_staged_missing",
    /// Machine name.
    MachineName = "machine_name",
    /// Machine name invalid.
    MachineNameInvalid = "machine_name_invalid",
    /// Machine name taken.
    MachineNameTaken = "machine_name_taken",
    /// Machine network backend unknown.
    MachineNetworkBackendUnknown = "machine_network_backend_unknown",
    /// Machine network incoherent.
    MachineNetworkIncoherent = "machine_network_incoherent",
    /// Machine network invalid.
    MachineNetworkInvalid = "machine_network_invalid",
    /// Machine not found.
    MachineNotFound = "machine_not_found",
    /// Machine not idle.
    MachineNotIdle = "machine_not_idle",
    /// Machine not owned.
    MachineNotOwned = "machine_not_owned",
    /// Machine not running.
    MachineNotRunning = "machine_not_running",
    /// Machine port invalid.
    MachinePortInvalid = "machine_port_invalid",
    /// Machine ports need virtio net.
    MachinePortsNeedVirtioNet = "machine_ports_need_virtio_net",
    /// Machine resources out of range.
    MachineResourcesOutOfRange = "machine_resources_out_of_range",
    /// Machine state unsupported.
    MachineStateUnsupported = "machine_state_unsupported",
    /// Malformed head.
    MalformedHead = "malformed_head",
    /// Managed command has no reservation.
    ManagedCommandHasNoReservation = "managed_command_has_no_reservation",
    /// Managed machine.
    ManagedMachine = "managed_machine",
    /// Managed machine not placed.
    ManagedMachineNotPlaced = "managed_machine_not_placed",
    /// Managed needs persistent worker.
    ManagedNeedsPersistentWorker = "managed_needs_persistent_worker",
    /// Managed size is the profiles.
    ManagedSizeIsTheProfiles = "managed_size_is_the_profiles",
    /// Mask entropy exhausted.
    MaskEntropyExhausted = "mask_entropy_exhausted",
    /// Masked server frame.
    MaskedServerFrame = "masked_server_frame",
    /// Max active.
    MaxActive = "max_active",
    /// Max bytes.
    MaxBytes = "max_bytes",
    /// Max chunk extension.
    MaxChunkExtension = "max_chunk_extension",
    /// Max frame len out of range.
    MaxFrameLenOutOfRange = "max_frame_len_out_of_range",
    /// Max head bytes.
    MaxHeadBytes = "max_head_bytes",
    /// Max headers.
    MaxHeaders = "max_headers",
    /// Max message len out of range.
    MaxMessageLenOutOfRange = "max_message_len_out_of_range",
    /// Max pending.
    MaxPending = "max_pending",
    /// Max records.
    MaxRecords = "max_records",
    /// Max request body.
    MaxRequestBody = "max_request_body",
    /// Max request body out of range.
    MaxRequestBodyOutOfRange = "max_request_body_out_of_range",
    /// Max request bytes zero.
    MaxRequestBytesZero = "max_request_bytes_zero",
    /// Max response body.
    MaxResponseBody = "max_response_body",
    /// Max response bytes out of range.
    MaxResponseBytesOutOfRange = "max_response_bytes_out_of_range",
    /// Max trailer bytes.
    MaxTrailerBytes = "max_trailer_bytes",
    /// Memory bytes.
    MemoryBytes = "memory_bytes",
    /// Memory leases.
    MemoryLeases = "memory_leases",
    /// Memory out of range.
    MemoryOutOfRange = "memory_out_of_range",
    /// Memory records.
    MemoryRecords = "memory_records",
    /// Message too large.
    MessageTooLarge = "message_too_large",
    /// Metadata integer.
    MetadataInteger = "metadata_integer",
    /// Metadata string.
    MetadataString = "metadata_string",
    /// Metrics not utf8.
    MetricsNotUtf8 = "metrics_not_utf8",
    /// Needs plain image machine.
    NeedsPlainImageMachine = "needs_plain_image_machine",
    /// Network without allowlist.
    NetworkWithoutAllowlist = "network_without_allowlist",
    /// Next timeout.
    NextTimeout = "next_timeout",
    /// No acceptance.
    NoAcceptance = "no_acceptance",
    /// No claim.
    NoClaim = "no_claim",
    /// No creation evidence.
    NoCreationEvidence = "no_creation_evidence",
    /// No initial op.
    NoInitialOp = "no_initial_op",
    /// No machine.
    NoMachine = "no_machine",
    /// No randomness.
    NoRandomness = "no_randomness",
    /// No spec.
    NoSpec = "no_spec",
    /// No start is managed only.
    NoStartIsManagedOnly = "no_start_is_managed_only",
    /// No thread.
    NoThread = "no_thread",
    /// No tokio runtime.
    NoTokioRuntime = "no_tokio_runtime",
    /// Node path not normalized.
    NodePathNotNormalized = "node_path_not_normalized",
    /// Non minimal length.
    NonMinimalLength = "non_minimal_length",
    /// Not a command.
    NotACommand = "not_a_command",
    /// Not a machine command.
    NotAMachineCommand = "not_a_machine_command",
    /// Not a terminal.
    NotATerminal = "not_a_terminal",
    /// Not assigned.
    NotAssigned = "not_assigned",
    /// Not found.
    NotFound = "not_found",
    /// Not freshly accepted.
    NotFreshlyAccepted = "not_freshly_accepted",
    /// Not open.
    NotOpen = "not_open",
    /// Not quiesced.
    NotQuiesced = "not_quiesced",
    /// Not reserved.
    NotReserved = "not_reserved",
    /// Not slot holder.
    NotSlotHolder = "not_slot_holder",
    /// Not stopped.
    NotStopped = "not_stopped",
    /// Observation incarnation.
    ObservationIncarnation = "observation_incarnation",
    /// Observation outdated.
    ObservationOutdated = "observation_outdated",
    /// Operation in progress.
    OperationInProgress = "operation_in_progress",
    /// Operation phase.
    OperationPhase = "operation_phase",
    /// Operation timeout out of range.
    OperationTimeoutOutOfRange = "operation_timeout_out_of_range",
    /// Output after exit.
    OutputAfterExit = "output_after_exit",
    /// Output allowance.
    OutputAllowance = "output_allowance",
    /// Output allowance out of range.
    OutputAllowanceOutOfRange = "output_allowance_out_of_range",
    /// Output invalid utf8.
    OutputInvalidUtf8 = "output_invalid_utf8",
    /// Overlapping mount targets.
    OverlappingMountTargets = "overlapping_mount_targets",
    /// Overlay out of range.
    OverlayOutOfRange = "overlay_out_of_range",
    /// Owner.
    Owner = "owner",
    /// Partition.
    Partition = "partition",
    /// Partition missing.
    PartitionMissing = "partition_missing",
    /// Path outside download roots.
    PathOutsideDownloadRoots = "path_outside_download_roots",
    /// Path outside upload roots.
    PathOutsideUploadRoots = "path_outside_upload_roots",
    /// Payload decode.
    PayloadDecode = "payload_decode",
    /// Payload not canonical.
    PayloadNotCanonical = "payload_not_canonical",
    /// Payload too large.
    PayloadTooLarge = "payload_too_large",
    /// Per direction below per file.
    PerDirectionBelowPerFile = "per_direction_below_per_file",
    /// Ping payload too long.
    PingPayloadTooLong = "ping_payload_too_long",
    /// Plain http requires loopback.
    PlainHttpRequiresLoopback = "plain_http_requires_loopback",
    /// Plain http requires opt in.
    PlainHttpRequiresOptIn = "plain_http_requires_opt_in",
    /// Poll interval.
    PollInterval = "poll_interval",
    /// Pool checkout out of range.
    PoolCheckoutOutOfRange = "pool_checkout_out_of_range",
    /// Pool checkout timeout.
    PoolCheckoutTimeout = "pool_checkout_timeout",
    /// Pool closed.
    PoolClosed = "pool_closed",
    /// Port in use.
    PortInUse = "port_in_use",
    /// Ports.
    Ports = "ports",
    /// Postgres.
    Postgres = "postgres",
    /// Postgres ca.
    PostgresCa = "postgres_ca",
    /// Postgres ca file.
    PostgresCaFile = "postgres_ca_file",
    /// Postgres constraint.
    PostgresConstraint = "postgres_constraint",
    /// Postgres contention.
    PostgresContention = "postgres_contention",
    /// Postgres io.
    PostgresIo = "postgres_io",
    /// Postgres plaintext remote.
    PostgresPlaintextRemote = "postgres_plaintext_remote",
    /// Postgres tls.
    PostgresTls = "postgres_tls",
    /// Postgres tls unix socket.
    PostgresTlsUnixSocket = "postgres_tls_unix_socket",
    /// Postgres unavailable.
    PostgresUnavailable = "postgres_unavailable",
    /// Postgres url.
    PostgresUrl = "postgres_url",
    /// Preparation deadline.
    PreparationDeadline = "preparation_deadline",
    /// Present.
    Present = "present",
    /// Profile budget.
    ProfileBudget = "profile_budget",
    /// Profile per direction out of range.
    ProfilePerDirectionOutOfRange = "profile_per_direction_out_of_range",
    /// Profile per file out of range.
    ProfilePerFileOutOfRange = "profile_per_file_out_of_range",
    /// Program length.
    ProgramLength = "program_length",
    /// Program nul.
    ProgramNul = "program_nul",
    /// Projection mismatch.
    ProjectionMismatch = "projection_mismatch",
    /// Queue budget.
    QueueBudget = "queue_budget",
    /// Queue deadline.
    QueueDeadline = "queue_deadline",
    /// Read failed.
    ReadFailed = "read_failed",
    /// Read past input buffer.
    ReadPastInputBuffer = "read_past_input_buffer",
    /// Readyz body not empty.
    ReadyzBodyNotEmpty = "readyz_body_not_empty",
    /// Receive idle out of range.
    ReceiveIdleOutOfRange = "receive_idle_out_of_range",
    /// Record invalid.
    RecordInvalid = "record_invalid",
    /// Record kind mismatch.
    RecordKindMismatch = "record_kind_mismatch",
    /// Record on another worker.
    RecordOnAnotherWorker = "record_on_another_worker",
    /// A record read back before dispatch after this controller saw it past
    /// `ready` (a rolled-back row): it is never dispatched from that read.
    RecordWentBack = "record_went_back",
    /// Redirect.
    Redirect = "redirect",
    /// Rejected body too large.
    RejectedBodyTooLarge = "rejected_body_too_large",
    /// Rejected json shape.
    RejectedJsonShape = "rejected_json_shape",
    /// Rejected json syntax.
    RejectedJsonSyntax = "rejected_json_syntax",
    /// Rejected media type.
    RejectedMediaType = "rejected_media_type",
    /// Rejected query.
    RejectedQuery = "rejected_query",
    /// Rejected upgrade.
    RejectedUpgrade = "rejected_upgrade",
    /// Release before absence.
    ReleaseBeforeAbsence = "release_before_absence",
    /// Reply checkpoint not branchable.
    ReplyCheckpointNotBranchable = "reply_checkpoint_not_branchable",
    /// Reply lost.
    ReplyLost = "reply_lost",
    /// Reply mismatch.
    ReplyMismatch = "reply_mismatch",
    /// Reply mounts mismatch.
    ReplyMountsMismatch = "reply_mounts_mismatch",
    /// Reply name mismatch.
    ReplyNameMismatch = "reply_name_mismatch",
    /// Reply network mismatch.
    ReplyNetworkMismatch = "reply_network_mismatch",
    /// Reply ports mismatch.
    ReplyPortsMismatch = "reply_ports_mismatch",
    /// Reply resources mismatch.
    ReplyResourcesMismatch = "reply_resources_mismatch",
    /// Request body.
    RequestBody = "request_body",
    /// Request body too large.
    RequestBodyTooLarge = "request_body_too_large",
    /// Request cap below per file.
    RequestCapBelowPerFile = "request_cap_below_per_file",
    /// Request none.
    RequestNone = "request_none",
    /// Request target.
    RequestTarget = "request_target",
    /// Reserved opcode.
    ReservedOpcode = "reserved_opcode",
    /// Reserved ports.
    ReservedPorts = "reserved_ports",
    /// Resolved not loopback.
    ResolvedNotLoopback = "resolved_not_loopback",
    /// Response body.
    ResponseBody = "response_body",
    /// Response cap below per file.
    ResponseCapBelowPerFile = "response_cap_below_per_file",
    /// Restart policy unsupported.
    RestartPolicyUnsupported = "restart_policy_unsupported",
    /// Result state.
    ResultState = "result_state",
    /// Result write once.
    ResultWriteOnce = "result_write_once",
    /// Retained machines.
    RetainedMachines = "retained_machines",
    /// Retention.
    Retention = "retention",
    /// Row vanished.
    RowVanished = "row_vanished",
    /// Rows out of range.
    RowsOutOfRange = "rows_out_of_range",
    /// Rsv bits set.
    RsvBitsSet = "rsv_bits_set",
    /// Running.
    Running = "running",
    /// Runtime stopped.
    RuntimeStopped = "runtime_stopped",
    /// Schema.
    Schema = "schema",
    /// Schema missing.
    SchemaMissing = "schema_missing",
    /// Seal.
    Seal = "seal",
    /// Sealed length.
    SealedLength = "sealed_length",
    /// Second exit.
    SecondExit = "second_exit",
    /// Send buffer full.
    SendBufferFull = "send_buffer_full",
    /// Session budget.
    SessionBudget = "session_budget",
    /// Session budget out of range.
    SessionBudgetOutOfRange = "session_budget_out_of_range",
    /// Session closed.
    SessionClosed = "session_closed",
    /// Session over budget.
    SessionOverBudget = "session_over_budget",
    /// Sha256 mismatch.
    Sha256Mismatch = "sha256_mismatch",
    /// Shutting down.
    ShuttingDown = "shutting_down",
    /// Size out of range.
    SizeOutOfRange = "size_out_of_range",
    /// Slot busy.
    SlotBusy = "slot_busy",
    /// Slot kept.
    SlotKept = "slot_kept",
    /// Socket dir writable by others.
    SocketDirWritableByOthers = "socket_dir_writable_by_others",
    /// Socket not a socket.
    SocketNotASocket = "socket_not_a_socket",
    /// Socket owner mismatch.
    SocketOwnerMismatch = "socket_owner_mismatch",
    /// Socket requires plain http.
    SocketRequiresPlainHttp = "socket_requires_plain_http",
    /// Socket writable by others.
    SocketWritableByOthers = "socket_writable_by_others",
    /// Sqlite.
    Sqlite = "sqlite",
    /// Sqlite busy.
    SqliteBusy = "sqlite_busy",
    /// Sqlite cannot open.
    SqliteCannotOpen = "sqlite_cannot_open",
    /// Sqlite constraint.
    SqliteConstraint = "sqlite_constraint",
    /// Sqlite corrupt.
    SqliteCorrupt = "sqlite_corrupt",
    /// Sqlite disk full.
    SqliteDiskFull = "sqlite_disk_full",
    /// Sqlite io.
    SqliteIo = "sqlite_io",
    /// Sqlite permissions.
    SqlitePermissions = "sqlite_permissions",
    /// Sqlite read only.
    SqliteReadOnly = "sqlite_read_only",
    /// Sse chunk too large.
    SseChunkTooLarge = "sse_chunk_too_large",
    /// Sse event too large.
    SseEventTooLarge = "sse_event_too_large",
    /// Sse input after finish.
    SseInputAfterFinish = "sse_input_after_finish",
    /// Sse line too long.
    SseLineTooLong = "sse_line_too_long",
    /// Stage.
    Stage = "stage",
    /// Start reply mismatch.
    StartReplyMismatch = "start_reply_mismatch",
    /// Start uncertain.
    StartUncertain = "start_uncertain",
    /// Status code.
    StatusCode = "status_code",
    /// Stdin encoding.
    StdinEncoding = "stdin_encoding",
    /// Stdin not utf8.
    StdinNotUtf8 = "stdin_not_utf8",
    /// Stdin too long.
    StdinTooLong = "stdin_too_long",
    /// Stdin with stream.
    StdinWithStream = "stdin_with_stream",
    /// Steps.
    Steps = "steps",
    /// Storage out of range.
    StorageOutOfRange = "storage_out_of_range",
    /// Store capability.
    StoreCapability = "store_capability",
    /// Store not durable.
    StoreNotDurable = "store_not_durable",
    /// Store task lost.
    StoreTaskLost = "store_task_lost",
    /// Store thread lost.
    StoreThreadLost = "store_thread_lost",
    /// Stream ended without exit.
    StreamEndedWithoutExit = "stream_ended_without_exit",
    /// Stream on a managed machine.
    StreamOnAManagedMachine = "stream_on_a_managed_machine",
    /// Stream with background.
    StreamWithBackground = "stream_with_background",
    /// Stream with stdin.
    StreamWithStdin = "stream_with_stdin",
    /// A caller of this runtime already streams this execution's output.
    StreamKeyTaken = "stream_key_taken",
    /// The runtime already forwards as many streamed executions as it may.
    StreamsExhausted = "streams_exhausted",
    /// Tail out of range.
    TailOutOfRange = "tail_out_of_range",
    /// Telemetry pending.
    TelemetryPending = "telemetry_pending",
    /// Terminal.
    Terminal = "terminal",
    /// Terminal already registered.
    TerminalAlreadyRegistered = "terminal_already_registered",
    /// Terminal checkpoint source.
    TerminalCheckpointSource = "terminal_checkpoint_source",
    /// Terminal consumer.
    TerminalConsumer = "terminal_consumer",
    /// Terminal consumer bound.
    TerminalConsumerBound = "terminal_consumer_bound",
    /// Terminal file manifest.
    TerminalFileManifest = "terminal_file_manifest",
    /// Terminal limit.
    TerminalLimit = "terminal_limit",
    /// Terminal message on an op.
    TerminalMessageOnAnOp = "terminal_message_on_an_op",
    /// Terminal needs retained machine.
    TerminalNeedsRetainedMachine = "terminal_needs_retained_machine",
    /// Terminal not live here.
    TerminalNotLiveHere = "terminal_not_live_here",
    /// Terminal recovered.
    TerminalRecovered = "terminal_recovered",
    /// Terminal retired.
    TerminalRetired = "terminal_retired",
    /// Terminal session.
    TerminalSession = "terminal_session",
    /// Terminal task ended.
    TerminalTaskEnded = "terminal_task_ended",
    /// Terminal wait.
    TerminalWait = "terminal_wait",
    /// Text after exit.
    TextAfterExit = "text_after_exit",
    /// Text frame too long.
    TextFrameTooLong = "text_frame_too_long",
    /// Thread spawn.
    ThreadSpawn = "thread_spawn",
    /// Timeout.
    Timeout = "timeout",
    /// Timeout out of range.
    TimeoutOutOfRange = "timeout_out_of_range",
    /// Timeout over budget.
    TimeoutOverBudget = "timeout_over_budget",
    /// Timeout range.
    TimeoutRange = "timeout_range",
    /// Timestamp.
    Timestamp = "timestamp",
    /// Tls ca file.
    TlsCaFile = "tls_ca_file",
    /// Tls client cert.
    TlsClientCert = "tls_client_cert",
    /// Tls client key.
    TlsClientKey = "tls_client_key",
    /// Tls handshake.
    TlsHandshake = "tls_handshake",
    /// Tls provider.
    TlsProvider = "tls_provider",
    /// Tls requires ca file.
    TlsRequiresCaFile = "tls_requires_ca_file",
    /// Tls server name.
    TlsServerName = "tls_server_name",
    /// Too many artifacts.
    TooManyArtifacts = "too_many_artifacts",
    /// Too many cidrs.
    TooManyCidrs = "too_many_cidrs",
    /// Too many env.
    TooManyEnv = "too_many_env",
    /// Too many files.
    TooManyFiles = "too_many_files",
    /// Too many headers.
    TooManyHeaders = "too_many_headers",
    /// Too many hostnames.
    TooManyHostnames = "too_many_hostnames",
    /// Too many metadata.
    TooManyMetadata = "too_many_metadata",
    /// Too many mounts.
    TooManyMounts = "too_many_mounts",
    /// Too many ports.
    TooManyPorts = "too_many_ports",
    /// Too many roots.
    TooManyRoots = "too_many_roots",
    /// Too many workers.
    TooManyWorkers = "too_many_workers",
    /// Too many workload args.
    TooManyWorkloadArgs = "too_many_workload_args",
    /// Trailer bytes.
    TrailerBytes = "trailer_bytes",
    /// Transfer encoding.
    TransferEncoding = "transfer_encoding",
    /// Transport not supported.
    TransportNotSupported = "transport_not_supported",
    /// Truncated.
    Truncated = "truncated",
    /// Ttl.
    Ttl = "ttl",
    /// Two machines.
    TwoMachines = "two_machines",
    /// Unauthorized.
    Unauthorized = "unauthorized",
    /// Unavailable.
    Unavailable = "unavailable",
    /// Unexpected answer.
    UnexpectedAnswer = "unexpected_answer",
    /// Unexpected media type.
    UnexpectedMediaType = "unexpected_media_type",
    /// Unexpected reply.
    UnexpectedReply = "unexpected_reply",
    /// Unexpected status.
    UnexpectedStatus = "unexpected_status",
    /// Unexpected text frame.
    UnexpectedTextFrame = "unexpected_text_frame",
    /// Unknown envelope version.
    UnknownEnvelopeVersion = "unknown_envelope_version",
    /// Unknown key id.
    UnknownKeyId = "unknown_key_id",
    /// Unknown layout version.
    UnknownLayoutVersion = "unknown_layout_version",
    /// Unknown record kind.
    UnknownRecordKind = "unknown_record_kind",
    /// Unknown sealed version.
    UnknownSealedVersion = "unknown_sealed_version",
    /// Unknown worker.
    UnknownWorker = "unknown_worker",
    /// Unknown worker version.
    UnknownWorkerVersion = "unknown_worker_version",
    /// Unread output.
    UnreadOutput = "unread_output",
    /// Unread output bytes.
    UnreadOutputBytes = "unread_output_bytes",
    /// Unread output chunks.
    UnreadOutputChunks = "unread_output_chunks",
    /// Unrequested extension.
    UnrequestedExtension = "unrequested_extension",
    /// Unrequested subprotocol.
    UnrequestedSubprotocol = "unrequested_subprotocol",
    /// Unserializable body.
    UnserializableBody = "unserializable_body",
    /// Updated before accepted.
    UpdatedBeforeAccepted = "updated_before_accepted",
    /// Upgrade header.
    UpgradeHeader = "upgrade_header",
    /// Upgrade not websocket.
    UpgradeNotWebsocket = "upgrade_not_websocket",
    /// Upgrade refused.
    UpgradeRefused = "upgrade_refused",
    /// Upload reply mismatch.
    UploadReplyMismatch = "upload_reply_mismatch",
    /// Usage missing.
    UsageMissing = "usage_missing",
    /// User.
    User = "user",
    /// User agent.
    UserAgent = "user_agent",
    /// User empty.
    UserEmpty = "user_empty",
    /// User too long.
    UserTooLong = "user_too_long",
    /// Verify failed.
    VerifyFailed = "verify_failed",
    /// Version.
    Version = "version",
    /// Version mismatch.
    VersionMismatch = "version_mismatch",
    /// Volume delete body not empty.
    VolumeDeleteBodyNotEmpty = "volume_delete_body_not_empty",
    /// Volume delete not confirmed.
    VolumeDeleteNotConfirmed = "volume_delete_not_confirmed",
    /// Volume size out of range.
    VolumeSizeOutOfRange = "volume_size_out_of_range",
    /// Wait out of range.
    WaitOutOfRange = "wait_out_of_range",
    /// Wait timeout.
    WaitTimeout = "wait_timeout",
    /// Wire body.
    WireBody = "wire_body",
    /// Workdir bad segment.
    WorkdirBadSegment = "workdir_bad_segment",
    /// Workdir forbidden byte.
    WorkdirForbiddenByte = "workdir_forbidden_byte",
    /// Workdir not absolute.
    WorkdirNotAbsolute = "workdir_not_absolute",
    /// Workdir too long.
    WorkdirTooLong = "workdir_too_long",
    /// Worker bad request.
    WorkerBadRequest = "worker_bad_request",
    /// Worker capacity.
    WorkerCapacity = "worker_capacity",
    /// Worker error.
    WorkerError = "worker_error",
    /// Worker error event.
    WorkerErrorEvent = "worker_error_event",
    /// Worker error text.
    WorkerErrorText = "worker_error_text",
    /// Worker generation.
    WorkerGeneration = "worker_generation",
    /// Worker id.
    WorkerId = "worker_id",
    /// Worker internal error.
    WorkerInternalError = "worker_internal_error",
    /// Worker lease.
    WorkerLease = "worker_lease",
    /// Worker output cap.
    WorkerOutputCap = "worker_output_cap",
    /// Worker request timeout.
    WorkerRequestTimeout = "worker_request_timeout",
    /// Worker runtime stalled.
    WorkerRuntimeStalled = "worker_runtime_stalled",
    /// Worker unavailable.
    WorkerUnavailable = "worker_unavailable",
    /// Workload args too long.
    WorkloadArgsTooLong = "workload_args_too_long",
    /// Workload requires image source.
    WorkloadRequiresImageSource = "workload_requires_image_source",
    /// Write failed.
    WriteFailed = "write_failed",
    /// Write timeout.
    WriteTimeout = "write_timeout",
    /// Write wait out of range.
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
}
