"""The exceptions nanoengine raises on bad input.

Every message says what went wrong *and* what to do about it. Each class also derives from the
built-in exception a Python user would reach for first (ValueError, FileNotFoundError,
MemoryError), so `except ValueError` keeps working in code that does not know nanoengine.
Arguments are checked before anything is queued, so after any of these the engine is unchanged:
no request was queued and no KV block was taken.

Any other exception inside a call (a part plugged in through a seam that raises, a
KeyboardInterrupt, a stream closed early) ends the call's requests instead: `LLM` aborts them
(`LLMEngine.abort_request`, as vLLM names it), frees their blocks, and answers the next call as before.
"""


class NanoEngineError(Exception):
    """Base class of every error nanoengine raises on purpose."""


class InvalidArgumentError(NanoEngineError, ValueError):
    """An argument is of the wrong type or out of range. `parameter` names it and `value` holds what
    was given (vLLM's VLLMValidationError carries the same two)."""

    def __init__(self, message: str, *, parameter: str | None = None, value=None):
        super().__init__(message)
        self.parameter, self.value = parameter, value


class ModelNotFoundError(NanoEngineError, FileNotFoundError):
    """The model could not be found: the embedded package is missing, or a path does not exist."""


class UnsupportedModelError(NanoEngineError, ValueError):
    """The file exists but is not a model nanoengine can run (not a GGUF, or not llama), or its layers
    need a KV cache layout the settings cannot serve (a sliding window below one block or beyond
    max_model_len, or a hybrid model given parts that know one KV cache group only)."""


class InvalidRequestError(InvalidArgumentError):
    """A prompt, its SamplingParams or another argument of generate/chat/stream cannot be served
    (empty, too long, of the wrong type, out of range)."""


class InvalidEngineArgumentError(InvalidArgumentError):
    """An argument of LLM(...) (vLLM's engine arguments) is of the wrong type or out of range."""


class BackendUnavailableError(NanoEngineError, ImportError):
    """The attention backend asked for needs a package this machine lacks (Triton has Linux wheels only)."""


class KVCacheTooSmallError(NanoEngineError, MemoryError):
    """The KV memory budget cannot hold what was asked of it."""


class EngineStalledError(NanoEngineError, RuntimeError):
    """A step could make no progress: it scheduled no token and preempted nothing while requests
    remain. The engine's own parts never do this; a part plugged in through a seam
    (a scheduler or KV cache manager of one's own) can, and without this check the loop would spin."""


class RequestAbortedError(NanoEngineError, RuntimeError):
    """A paused stream's request was aborted while another call ran: a step of that call failed, and a
    failed step aborts every request it may have left half-computed."""
