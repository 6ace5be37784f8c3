"""How a remote source sets its clients up: default connect and read timeouts for http(s)://
and gs:// unless ``storage_options`` set their own (NOTE [ Requests that never answer ]), and
obstore's errors as one readable line, missing credentials named."""

from __future__ import annotations

import pytest

from stoker.storage.fsspec_handle import with_default_timeouts


def test_http_and_gcs_get_connect_and_read_timeouts_unless_the_options_set_theirs() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    default = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=15.0)
    given = {"client_kwargs": {"headers": {"a": "b"}}}
    http = with_default_timeouts("https", given)
    assert http == {"client_kwargs": {"headers": {"a": "b"}, "timeout": default}}
    assert given == {"client_kwargs": {"headers": {"a": "b"}}}  # the caller's left as it was
    assert with_default_timeouts("gs", {"project": "p"}) == {
        "project": "p", "requests_timeout": default}
    own = aiohttp.ClientTimeout(sock_read=1.0)
    assert with_default_timeouts("http", {"client_kwargs": {"timeout": own}}) == {
        "client_kwargs": {"timeout": own}}
    assert with_default_timeouts("gcs", {"requests_timeout": own}) == {"requests_timeout": own}
    assert with_default_timeouts("s3", {"anon": True}) == {"anon": True}  # s3fs sets its own


def _obstore_error(message: str) -> BaseException:
    exceptions = pytest.importorskip("obstore.exceptions")
    dump = "\n\nDebug source:\nGeneric {\n    store: \"S3\",\n" + "    ...\n" * 20 + "}"
    return exceptions.GenericError(message + dump)  # type: ignore[no-any-return]


def test_obstore_errors_read_as_one_line_and_missing_credentials_are_named() -> None:
    from stoker.storage.obstore_files import _translated
    from stoker.storage.retry import is_transient

    failing = _translated(_obstore_error(
        "Generic S3 error: Error performing GET http://h/b/k in 1ms - Server returned non-2xx "
        "status code: 503 Service Unavailable: <Error/>"), "s3://b/k")
    assert type(failing) is OSError and is_transient(failing)
    assert str(failing) == (
        "s3://b/k: Generic S3 error: Error performing GET http://h/b/k in 1ms - Server "
        "returned non-2xx status code: 503 Service Unavailable: <Error/>")
    imds = ("Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token "
            "in 1ms - Server returned non-2xx status code: {}")
    refused = _translated(_obstore_error(imds.format("403 Forbidden: denied")), "s3://b/k")
    assert isinstance(refused, PermissionError) and not is_transient(refused)
    assert str(refused) == (
        "s3://b/k: no credentials found: obstore looks in the AWS_* environment variables, web "
        "identity, then the instance's metadata service, which failed ("
        + imds.format("403 Forbidden: denied") + "); give them there or in storage_options "
        "(key, secret, token; anon=True for a public bucket)")
    throttled = _translated(_obstore_error(imds.format("429 Too Many Requests")), "s3://b/k")
    assert is_transient(throttled) and "no credentials found" in str(throttled)
