"""`helmline serve api`: run the HTTP API until SIGTERM."""

from helmline.api._app import create_app
from helmline.api._settings import ApiSettings
from helmline.runtime import ServiceHost, Setup, run_service


def setup_api(settings: ApiSettings) -> Setup:
    """Serve the API on a started host's connection (tests run it in-process this way)."""

    async def setup(host: ServiceHost) -> None:
        app = create_app(host, settings)
        host.on_shutdown(app.state.lister.close)
        # Follow key changes before serving: no request is checked against a key this
        # replica could miss the revocation of.
        await app.state.authenticator.keys.follow()
        host.on_shutdown(app.state.authenticator.keys.close)
        await host.serve_http(app, settings.api_host, settings.api_port)
        # Cleanups run last added first: open event streams end before uvicorn waits for
        # their connections to close.
        host.on_shutdown(app.state.fan_out.close_all)

    return setup


def main() -> None:
    """Run the API service."""
    settings = ApiSettings()
    run_service("api", settings, setup_api(settings))


if __name__ == "__main__":
    main()
