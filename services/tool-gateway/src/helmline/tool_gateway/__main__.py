"""`helmline serve tool-gateway`: run the tool-gateway service until SIGTERM."""

from helmline.runtime import RuntimeSettings, run_service


def main() -> None:
    """Run the tool-gateway service."""
    run_service("tool-gateway", RuntimeSettings())


if __name__ == "__main__":
    main()
