"""`helmline serve sandbox`: run the sandbox service until SIGTERM."""

from helmline.runtime import run_service
from helmline.sandbox._service import sandbox_setup
from helmline.sandbox._settings import SandboxSettings


def main() -> None:
    """Run the sandbox service."""
    settings = SandboxSettings()
    run_service("sandbox", settings, sandbox_setup(settings))


if __name__ == "__main__":
    main()
