# The image every service of docker-compose.yaml runs: Python 3.11, Java 17,
# Debian's PostgreSQL and Chromium (make setup installs them), and this
# project's virtualenv, built by the same `make setup` the README uses.
FROM python:3.11-slim-bookworm
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless make postgresql procps >/dev/null \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
RUN make setup
ENV PATH=/app/.venv/bin:$PATH
