"""`helmline serve api`: run the HTTP API until SIGTERM."""

from helmline.api._app import create_app
from helmline.api._settings import ApiSettings
from helmline.runtime import ServiceHost, run_service


def main() -> None:
    """Run the API service."""
    settings = ApiSettings()

    async def setup(host: ServiceHost) -> None:
        await host.serve_http(create_app(host), settings.api_host, settings.api_port)

    run_service("api", settings, setup)


if __name__ == "__main__":
    main()
