# mirserve: the API and one embedded worker (`mirserve serve`), state in the /data volume.
#   docker build -t mirserve . && docker run -p 8000:8000 -v mirserve-data:/data mirserve
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY app ./app
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
# tini as PID 1: it forwards SIGTERM to `mirserve serve` and reaps engine processes orphaned by a killed worker.
# Graphviz lays out the job graph pictures (GET /jobs/{id}/graph.svg).
RUN apt-get update && apt-get install -y --no-install-recommends tini graphviz \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin mirserve \
    && mkdir /data && chown mirserve:mirserve /data
COPY --from=build /install /usr/local
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MIRSERVE_DATA_DIR=/data MIRSERVE_HOST=0.0.0.0 MIRSERVE_PORT=8000
USER mirserve
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('MIRSERVE_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["tini", "--"]
CMD ["mirserve", "serve"]
