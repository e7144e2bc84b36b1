# memstore's HTTP API (`memstore serve`) and its queue workers (`memstore worker`), for PostgreSQL.
#   docker build -t memstore .                      # extras: postgres,server
#   docker build --build-arg EXTRAS=postgres,server,local-embeddings -t memstore .
# compose.yaml runs it with PostgreSQL; docs/operations.md#containers explains both.
FROM python:3.11-slim

ARG EXTRAS=postgres,server
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY alembic ./alembic
COPY memstore ./memstore
RUN pip install ".[${EXTRAS}]" && rm -rf /src

# Never root at run time; the SQLite fallback and caches go to the user's home, not the image.
RUN useradd --create-home --uid 10001 memstore
USER memstore
WORKDIR /home/memstore
ENV MEMSTORE_DATA_DIR=/home/memstore/data

EXPOSE 8000
ENTRYPOINT ["memstore"]
# Behind an authenticating proxy that sets X-Forwarded-User; a wildcard bind needs the Host names.
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--user-header", "X-Forwarded-User", "--allowed-host", "localhost", "--allowed-host", "127.0.0.1", "--allowed-host", "memstore"]
