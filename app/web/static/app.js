// mirserve's page: submits through the JSON API and keeps statuses live by polling it. No framework.
"use strict";

const TERMINAL = new Set(["succeeded", "failed", "canceled"]);

function text(value) {
  return value === null || value === undefined ? "" : String(value);
}

function cell(row, content, href) {
  const td = row.insertCell();
  if (href) {
    const link = document.createElement("a");
    link.href = href;
    link.textContent = content;
    td.appendChild(link);
  } else {
    td.textContent = content;
  }
  return td;
}

function doing(job) {
  if (job.error) return `${job.error.type}: ${job.error.message}`;
  if (job.status === "running" && job.progress) {
    return `${job.progress.current_pass} (${job.progress.index}/${job.progress.total})`;
  }
  return "";
}

function renderJobs(table, page) {
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const job of page.items) {
    const row = body.insertRow();
    row.dataset.id = job.id;
    cell(row, job.id.slice(0, 8), `/ui/jobs/${job.id}`);
    const status = cell(row, job.status);
    status.className = `status status-${job.status}`;
    cell(row, job.created_at.slice(0, 19).replace("T", " "));
    cell(row, job.input.filename);
    cell(row, job.places);
    const s = job.summary;
    cell(row, s && s.nodes_before !== null && s.nodes_before !== undefined ? `${s.nodes_before} \u2192 ${s.nodes_after}` : "");
    cell(row, doing(job));
  }
  if (!page.items.length) {
    const row = body.insertRow();
    row.className = "empty";
    const td = cell(row, "No jobs yet.");
    td.colSpan = 7;
  }
  const total = document.getElementById("jobs-total");
  if (total) total.textContent = text(page.total);
}

async function poll(url, apply, keepGoing, seconds = 1.5) {
  for (;;) {
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" } });
      if (response.ok) {
        const data = await response.json();
        apply(data);
        if (!keepGoing(data)) return;
      }
    } catch (error) {
      // the service restarted or the network hiccuped: try again at the next tick
    }
    await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  }
}

function watchJobList() {
  const table = document.getElementById("jobs");
  if (!table) return;
  poll(table.dataset.live, (page) => renderJobs(table, page), () => true, 2);
}

function watchJob() {
  const section = document.getElementById("job");
  if (!section || !section.dataset.live) return;
  const status = document.getElementById("job-status");
  const progress = document.getElementById("job-progress");
  const bar = document.getElementById("job-bar");
  poll(section.dataset.live, (job) => {
    status.textContent = job.status;
    status.className = `status status-${job.status}`;
    progress.textContent = doing(job);
    if (job.progress) {
      bar.max = job.progress.total;
      bar.value = job.progress.index;
    }
    if (TERMINAL.has(job.status)) window.location.reload(); // the server renders the summary and pictures
  }, (job) => !TERMINAL.has(job.status), 1);
}

function submitForm() {
  const form = document.getElementById("submit-form");
  if (!form) return;
  const said = document.getElementById("submit-status");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData();
    // places and options go first: the service refuses a bad one before the upload
    for (const name of ["places", "options"]) {
      const value = form.elements[name].value.trim();
      if (value) data.append(name, value);
    }
    const file = form.elements.model.files[0];
    data.append("model", file, file.name);
    said.textContent = `uploading ${file.name}\u2026`;
    said.className = "";
    try {
      const response = await fetch("/optimize", { method: "POST", body: data });
      const body = await response.json();
      if (response.status === 202) {
        window.location.href = `/ui/jobs/${body.id}`;
        return;
      }
      said.className = "error";
      said.textContent = `${body.title || response.status}: ${body.detail || ""}` + (body.field ? ` (field ${body.field})` : "");
    } catch (error) {
      said.className = "error";
      said.textContent = `the upload failed: ${error}`;
    }
  });
}

submitForm();
watchJobList();
watchJob();
