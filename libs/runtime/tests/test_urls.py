from helmline.runtime import without_credentials


def test_credentials_are_left_out_of_every_url_of_a_list() -> None:
    urls = "nats://admin:s3cr%40t@127.0.0.1:4222,nats://api:pw@10.0.0.2:4223"
    assert without_credentials(urls) == "nats://127.0.0.1:4222,nats://10.0.0.2:4223"
    assert (
        without_credentials("postgresql://helmline:pw@localhost:5432/helmline")
        == "postgresql://localhost:5432/helmline"
    )
    assert without_credentials("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"
