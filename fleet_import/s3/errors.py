"""The one place S3's errors become ours: whatever botocore (or boto3's transfers) raises
for a read, a listing or the staging area leaves as one of our errors, of the kind the
classification table (error_table) gives its code, never its text. (The Redshift IAM login's
botocore errors are the warehouse's: `warehouse.redshift.driver.iam_error`; the relay's SQS
errors are only logged.)"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError

from fleet_import.error_table import classify, client_error_code, s3_error_code, s3_no_answer
from fleet_import.errors import ErrorKind, FleetImportError, error_of_kind
from fleet_import.explain import S3_NO_ANSWER

_REASONS = {
    "NoSuchBucket": "the bucket does not exist",
    "AccessDenied": "access denied",
    "AllAccessDisabled": "access to the bucket is disabled",
    "NoSuchKey": "the object no longer exists",
    "PreconditionFailed": "the object was replaced after discovery (its etag changed)",
    "InvalidObjectState": "the object is archived and must be restored first",
}


@contextmanager
def s3_errors(
    failed: str, terminal: type[FleetImportError], *, brief: bool = False
) -> Iterator[None]:
    """Run the block; an S3 error leaves it as `terminal` (terminal or configuration) or its
    transient variant (a TransientError too), with S3's code, marked `retried`: botocore
    retried it already (s3.client), the one layer that retries S3. Its message is `failed`
    (`cannot list s3://...`), then why: S3's answer in words, or with `brief` its code alone
    (the staging area's messages, which name the object an operator goes to look at)."""
    try:
        yield
    except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
        why = _code(exc) if brief else _in_words(exc)
        error = error_of_kind(classify(exc), f"{failed}: {why}", terminal, code=s3_error_code(exc))
        error.retried = True
        raise error from exc


def _in_words(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        code, status = client_error_code(exc)
        if classify(exc) is ErrorKind.TRANSIENT:
            return f"S3 answered {code or 'an error'} (HTTP {status}) after retries"
        reason = _REASONS.get(code, f"S3 refused the request (HTTP {status})")
        return f"{reason} ({code or status})"
    return f"{S3_NO_ANSWER} ({exc})" if s3_no_answer(exc) else str(exc)


def _code(exc: Exception) -> str:
    code = s3_error_code(exc) or type(exc).__name__
    return f"{S3_NO_ANSWER} ({code})" if s3_no_answer(exc) else code
