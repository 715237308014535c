"""`helmline serve sandbox`: run the sandbox service until SIGTERM."""

from helmline.runtime import RuntimeSettings, run_service


def main() -> None:
    """Run the sandbox service."""
    run_service("sandbox", RuntimeSettings())


if __name__ == "__main__":
    main()
