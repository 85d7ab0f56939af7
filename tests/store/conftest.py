"""A hand-made run every registered query can read (tests of sharing a store: object storage, read-only users)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from attnstore.tests.queries.helpers import write_saliency

# Three sentences with gold words (UPOS, heads, relations) and coreference mentions, one with an antecedent in its
# window ("the dog" after "she", as one entity): enough for the dependency, coreference and Kovaleva feature queries
# to find something.
SENTENCES = [
    [("the", "DET", 1, "det"), ("cat", "NOUN", 2, "nsubj"), ("sat", "VERB", None, "root"), (".", "PUNCT", 2, "punct")],
    [("she", "PRON", 1, "nsubj"), ("saw", "VERB", None, "root"), ("the", "DET", 3, "det"), ("dog", "NOUN", 1, "obj")],
    [("it", "PRON", 1, "nsubj"), ("did", "AUX", None, "root"), ("not", "PART", 1, "advmod"), ("run", "VERB", 1, "xcomp")],
]
MENTIONS = [
    [dict(word_start=0, word_end=2, head=1, entity="e1", kind="nominal", doc_order=0)],
    [
        dict(word_start=0, word_end=1, head=0, entity="e2", kind="pronoun", doc_order=1),
        dict(word_start=2, word_end=4, head=3, entity="e2", kind="nominal", doc_order=2),
    ],
    [dict(word_start=0, word_end=1, head=0, entity="e1", kind="pronoun", doc_order=3)],
]

# Parameters a registered query needs beyond `run` on this tiny run (counts lowered to its size).
QUERY_PARAMS = {
    "dependency": dict(min_count=1),
    "dependency_summary": dict(min_count=1),
    "run_similarity": dict(other="shared"),
    "head_match": dict(other="shared"),
    "head_match_matrix": dict(other="shared"),
    "head_profile_match": dict(other="shared"),
}


def random_maps(rng: np.random.Generator, n_layers: int, n_heads: int, length: int) -> np.ndarray:
    """Rows of positive numbers summing to 1, as float32."""
    maps = rng.random((n_layers, n_heads, length, length), dtype=np.float32) + 0.05
    return (maps / maps.sum(-1, keepdims=True)).astype(np.float32)


def add_frame(store, run: str) -> None:
    """A FrameNet annotation set on the last example: LU "run" (word 3), core element "it" (word 0), 3 words away."""
    import sqlalchemy as sa

    from attnstore.store.schema import Frame, FrameElement

    example_id = int(store.examples(run)["example_id"].iloc[-1])
    with store.session() as s:
        frame = dict(frame_id=1, frame="Self_motion", lu="run.v", target_start=3, target_end=4, char_start=11, char_end=14)
        frame_row_id = s.execute(sa.insert(Frame).returning(Frame.id), dict(example_id=example_id, **frame)).scalar_one()
        element = dict(name="Self_mover", core_type="Core", in_core_set=True, word_start=0, word_end=1, char_start=0, char_end=2)
        s.execute(sa.insert(FrameElement), dict(frame_row_id=frame_row_id, **element))


@pytest.fixture
def annotated_run(make_run):
    """annotated_run(store, name="shared") -> run name: 2 layers x 3 heads, three ragged examples over several chunks."""

    def build(store, name: str = "shared", seed: int = 0) -> str:
        rng = np.random.default_rng(seed)
        tokens = [["[CLS]", *(w for w, *_ in s), "[SEP]"] for s in SENTENCES]
        words = [[dict(form=w, lemma=w, upos=u, head=h, deprel=d) for w, u, h, d in s] for s in SENTENCES]
        maps = [random_maps(rng, 2, 3, len(t)) for t in tokens]
        norms = [rng.random((2, 3, len(t))).astype(np.float16).astype(np.float32) + 0.5 for t in tokens]  # weights=norm
        peaks = [
            np.stack([rng.normal(size=(len(t), 2)) * 50, rng.integers(0, 8, (len(t), 2)), rng.random((len(t), 2))], -1) for t in tokens
        ]
        run = make_run(store, maps, tokens, name=name, words_list=words, mentions_list=MENTIONS, norms_list=norms, peaks_list=peaks)
        add_frame(store, run)
        write_saliency(store, run, [rng.normal(size=len(t)) for t in tokens])  # attention_attribution
        return run

    build.make_run = make_run  # for a builder that adds a run of its own beside it
    return build


@pytest.fixture
def every_query():
    """{name: params} for every registered query that answers on any run (the queries of docs/QUERIES.md but those
    defined on a generated dataset: tests/queries/test_conformance.py runs them on one)."""
    from attnstore.queries import QUERIES, load_all

    load_all()
    return {name: QUERY_PARAMS.get(name, {}) for name in sorted(QUERIES) if QUERIES[name].dataset is None}


class S3Auth:
    """Credentials on the test S3 server: IAM users with a policy, and a switch that makes moto check them."""

    def __init__(self, endpoint: str, monkeypatch):
        self.endpoint = endpoint
        self.monkeypatch = monkeypatch

    def user(self, actions: list[str]) -> tuple[str, str]:
        """A new IAM user allowed `actions` on every bucket: (access key id, secret)."""
        import json
        import uuid

        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1")
        name = f"attnstore-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=name)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": ["*"]}]}
        iam.put_user_policy(UserName=name, PolicyName="attnstore-test", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def use(self, key: str, secret: str) -> None:
        """Make this process (and the processes it starts) use these credentials from now on."""
        import s3fs

        self.monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        self.monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        s3fs.S3FileSystem.clear_instance_cache()  # fsspec reuses file systems (and their credentials) by arguments

    @contextmanager
    def enforced(self):
        """Inside: the server refuses requests whose credentials or policy do not allow them (moto's IAM checks)."""
        import requests
        import s3fs

        previous = requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"0", timeout=10).json()
        try:
            yield
        finally:
            count = previous["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]
            requests.post(f"{self.endpoint}/moto-api/reset-auth", data=str(count).encode(), timeout=10)
            s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_auth(s3_endpoint, monkeypatch):
    auth = S3Auth(s3_endpoint, monkeypatch)
    yield auth
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # the environment's credentials are restored: drop clients made with others
