import io

from seqpack.progress import Progress


def test_progress_logs_plain_lines_when_not_a_tty():
    out = io.StringIO()
    with Progress(3, "work", stream=out, log_every=0.0) as bar:
        for _ in range(3):
            bar.update(1, loss=1.23456)
    text = out.getvalue()
    assert "work [" in text and "3/3" in text and "loss=1.235" in text
    assert "\r" not in text


def test_progress_disabled_prints_nothing():
    out = io.StringIO()
    with Progress(2, "quiet", stream=out, enabled=False) as bar:
        bar.update(2)
    assert out.getvalue() == ""
