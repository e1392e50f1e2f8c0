// Test-only checks of what the viewers make of our files, run by the specs through
// spec/support/viewers.rb. Each command prints one JSON object on stdout; the specs judge it.
//
//   node check.mjs schema FILE...
//     validates speedscope files against the JSON schema that the speedscope package ships
//     (dist/release/file-format-schema.json) with ajv.
//   node check.mjs speedscope FILE PNG
//     opens FILE the way `speedscope FILE` does (speedscope's own bundled page from the npm
//     package, file://, with `#localProfilePath=` naming a script that calls
//     `speedscope.loadFileFromBase64`), in headless Chromium, offline: every request that is
//     not a file:// one is refused and reported. Reports the names speedscope drew on its
//     canvases (CanvasRenderingContext2D#fillText, recorded by an init script), the share of
//     the flame chart's pixels that are frame colours, page errors, and saves a screenshot.
//   node check.mjs svg FILE PNG
//     opens an SVG (a flamegraph) in headless Chromium and reports its <text> contents after
//     its own script ran, the share of coloured pixels, page errors, and a screenshot.
//   node check.mjs timeline FILE PNG
//     opens a timeline (`ddprof-recorder timeline`, SVG or HTML) in headless Chromium and
//     reports its lanes (each lane's <title>: thread and shares), its spans by fill colour, the
//     share of coloured pixels, and, in the HTML page, what its hover panel shows once the
//     pointer is on a span of each state; page errors, and a screenshot.
//
// Chromium: CHROMIUM (default /usr/bin/chromium), started as this machine needs (README of
// the project's environment: no background networking, a fresh profile directory).
import fs from "node:fs"
import os from "node:os"
import path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

import Ajv from "ajv"
import { chromium } from "playwright-core"
import { PNG } from "pngjs"

const here = path.dirname(fileURLToPath(import.meta.url))
const speedscopeDir = path.join(here, "node_modules", "speedscope", "dist", "release")
const VIEWPORT = { width: 1280, height: 800 }

function print(result) {
  process.stdout.write(JSON.stringify(result) + "\n")
}

function schema(files) {
  const schema = JSON.parse(fs.readFileSync(path.join(speedscopeDir, "file-format-schema.json"), "utf8"))
  const ajv = new Ajv({ allErrors: true, strict: false })
  const validate = ajv.compile(schema)
  const results = files.map(file => {
    const valid = validate(JSON.parse(fs.readFileSync(file, "utf8")))
    return { file, valid, errors: valid ? [] : validate.errors }
  })
  const version = JSON.parse(fs.readFileSync(path.join(here, "node_modules", "speedscope", "package.json"), "utf8")).version
  print({ speedscope: version, schema: schema.$schema, results })
}

async function launch() {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "ddprof-chromium-"))
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    viewport: VIEWPORT,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      // speedscope draws frames with WebGL: without a GPU, Chromium's software WebGL.
      "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
      // The page loads the profile's script from another file:// path, as `speedscope FILE`.
      "--allow-file-access-from-files",
    ],
  })
  const refused = []
  await context.route("**/*", route => {
    const url = route.request().url()
    if (url.startsWith("file://") || url.startsWith("data:") || url.startsWith("blob:")) return route.continue()
    refused.push(url)
    return route.abort()
  })
  const close = async () => {
    await context.close()
    fs.rmSync(userDataDir, { recursive: true, force: true })
  }
  return { context, refused, close }
}

// Share of the pixels of `png` inside `box` whose colour is saturated (frame colours, not the
// white, grey and black of backgrounds, text and lines).
function colouredShare(png, box) {
  let coloured = 0
  let total = 0
  const x1 = Math.min(png.width, box.x + box.width)
  const y1 = Math.min(png.height, box.y + box.height)
  for (let y = Math.max(0, box.y); y < y1; y++) {
    for (let x = Math.max(0, box.x); x < x1; x++) {
      const i = (png.width * y + x) * 4
      const [r, g, b] = [png.data[i], png.data[i + 1], png.data[i + 2]]
      if (Math.max(r, g, b) - Math.min(r, g, b) > 40) coloured++
      total++
    }
  }
  return total ? coloured / total : 0
}

async function speedscope(file, png) {
  const { context, refused, close } = await launch()
  try {
    // `speedscope FILE` (bin/cli.mjs of the package) writes this script and opens the page with
    // #localProfilePath= naming it.
    const source = fs.readFileSync(file)
    const script = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "ddprof-speedscope-")), "profile.js")
    fs.writeFileSync(script, `speedscope.loadFileFromBase64(${JSON.stringify(path.basename(file))}, ${JSON.stringify(source.toString("base64"))})`)

    const page = await context.newPage()
    const errors = []
    page.on("pageerror", e => errors.push(String(e)))
    page.on("console", m => { if (m.type() === "error") errors.push(m.text()) })
    await page.addInitScript(() => {
      window.__drawnText = new Set()
      const fillText = CanvasRenderingContext2D.prototype.fillText
      CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
        window.__drawnText.add(String(text))
        return fillText.call(this, text, ...rest)
      }
    })
    const url = pathToFileURL(path.join(speedscopeDir, "index.html")).href + "#localProfilePath=" + script
    await page.goto(url)
    // The profile is loaded when speedscope has drawn a frame name on a canvas.
    await page.waitForFunction(() => window.__drawnText.size > 3, null, { timeout: 20000 })
    await page.waitForTimeout(500) // let it finish the frame it is drawing
    const drawn = await page.evaluate(() => [...window.__drawnText])
    const title = await page.title()
    const toolbar = await page.evaluate(() => document.body.innerText.split("\n").slice(0, 8))
    const shot = await page.screenshot({ path: png })
    // The flame chart: the largest canvas on the page.
    const box = await page.evaluate(() => {
      const canvases = [...document.querySelectorAll("canvas")].map(c => c.getBoundingClientRect())
      canvases.sort((a, b) => b.width * b.height - a.width * a.height)
      const r = canvases[0]
      return r && { x: Math.round(r.x), y: Math.round(r.y), width: Math.round(r.width), height: Math.round(r.height) }
    })
    const coloured = box ? colouredShare(PNG.sync.read(shot), box) : 0
    fs.rmSync(path.dirname(script), { recursive: true, force: true })
    print({ drawn, title, toolbar, flame_chart: box, coloured_share: coloured, errors, refused, screenshot: png })
  } finally {
    await close()
  }
}

// Opens one of our files (an SVG or an HTML page) in headless Chromium, offline, and once it has
// loaded, runs `inspect(page)`, which returns what it found there. Prints that, then the share of
// coloured pixels in a screenshot of the page (saved as PNG), page errors and refused requests.
async function inspectFile(file, png, inspect) {
  const { context, refused, close } = await launch()
  try {
    const page = await context.newPage()
    const errors = []
    page.on("pageerror", e => errors.push(String(e)))
    await page.goto(pathToFileURL(path.resolve(file)).href)
    await page.waitForLoadState("load")
    const found = await inspect(page)
    const shot = await page.screenshot({ path: png })
    const coloured = colouredShare(PNG.sync.read(shot), { x: 0, y: 0, width: VIEWPORT.width, height: VIEWPORT.height })
    print({ ...found, coloured_share: coloured, errors, refused, screenshot: png })
  } finally {
    await close()
  }
}

function svg(file, png) {
  return inspectFile(file, png, async page => {
    const texts = await page.evaluate(() => [...document.querySelectorAll("text")].map(t => t.textContent).filter(t => t.trim() !== ""))
    const frames = await page.evaluate(() => document.querySelectorAll("#frames > g, g[class='func_g'], g > title").length)
    return { texts, frames }
  })
}

function timeline(file, png) {
  return inspectFile(file, png, async page => {
    const lanes = await page.evaluate(() => [...document.querySelectorAll("g.lane > title")].map(t => t.textContent))
    const spans = await page.evaluate(() => {
      const counts = {}
      for (const r of document.querySelectorAll("rect")) {
        if (!r.querySelector("title")) continue
        const fill = r.getAttribute("fill")
        counts[fill] = (counts[fill] || 0) + 1
      }
      return counts
    })
    // Hover the widest span of each colour: what the page's panel says then.
    const hovered = {}
    if (await page.$("#hover")) {
      const fills = Object.keys(spans)
      for (const fill of fills) {
        const box = await page.evaluate(fill => {
          const rects = [...document.querySelectorAll(`rect[fill="${fill}"]`)].filter(r => r.querySelector("title"))
          rects.sort((a, b) => b.getBoundingClientRect().width - a.getBoundingClientRect().width)
          const b = rects[0].getBoundingClientRect()
          return { x: b.x + b.width / 2, y: b.y + b.height / 2 }
        }, fill)
        await page.mouse.move(box.x, box.y)
        hovered[fill] = await page.evaluate(() => document.getElementById("hover").textContent)
      }
    }
    return { lanes, spans, hovered }
  })
}

const [command, ...args] = process.argv.slice(2)
try {
  if (command === "schema") schema(args)
  else if (command === "speedscope") await speedscope(args[0], args[1])
  else if (command === "svg") await svg(args[0], args[1])
  else if (command === "timeline") await timeline(args[0], args[1])
  else throw new Error(`unknown command ${command}: schema FILE..., speedscope FILE PNG, svg FILE PNG, timeline FILE PNG`)
} catch (e) {
  print({ failure: String(e && e.stack || e) })
  process.exitCode = 1
}
