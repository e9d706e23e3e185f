"""What the object store's answers mean: a DeleteObjects answer of HTTP 200 can still list keys it did not delete
(S3 reports each key apart; the moto server of tests/process/test_object_storage.py never refuses one, so the answer
is written here in the shape botocore hands back)."""
import pytest

from core.errors import StorageError
from core.object_store import check_deleted


def test_keys_a_delete_left_are_refused_naming_the_first_and_the_count():
    check_deleted({"Deleted": [{"Key": "run/step_00000004/COMPLETE"}], "ResponseMetadata": {"HTTPStatusCode": 200}},
                  "ckpt")
    check_deleted({"Errors": []}, "ckpt")
    answer = {"Deleted": [{"Key": "run/step_00000008/COMPLETE"}],
              "Errors": [{"Key": "run/step_00000012/COMPLETE", "Code": "AccessDenied", "Message": "Access Denied"},
                         {"Key": "run/step_00000016/COMPLETE", "Code": "AccessDenied", "Message": "Access Denied"}],
              "ResponseMetadata": {"HTTPStatusCode": 200}}
    with pytest.raises(StorageError) as refused:
        check_deleted(answer, "ckpt")
    assert str(refused.value) == ("s3://ckpt/run/step_00000012/COMPLETE was not deleted (AccessDenied: Access Denied), "
                                  "nor 1 other object(s); give the credentials delete rights there, or lift the "
                                  "bucket's retention")


def test_a_missing_object_is_the_stores_answer_and_a_missing_local_file_is_not():
    """streaming's clients raise FileNotFoundError('Object URL not found.') for a missing object; an OS error about a
    local file (a staging copy removed under an upload) is no answer of the store's, and stays a traceback."""
    import errno

    from core.object_store import describe

    url = "s3://corpus/kjv"
    assert describe(FileNotFoundError(f"Object {url}/manifest.json not found."), url).startswith(
        f"not found in the object store: {url} (endpoint ")
    assert describe(FileNotFoundError(errno.ENOENT, "No such file or directory", "/cache/.manifest.json"), url) is None
