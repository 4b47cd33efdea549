// One Minecraft world: a flying-squid server (offline, superflat, 127.0.0.1) and one mineflayer bot per seat,
// driven by rollout.sandbox.minecraft.sidecar with JSON lines over a Unix socket.
//
// Started as `node sidecar.mjs '{"home": DIR, "port": P, "names": [...], "socket": PATH}'` (DIR holds the pinned
// node_modules). It listens on PATH for one connection, writes `{"ready": true, ...}` to it once every bot has
// spawned, then answers each request line `{"id", "seat", "op", "args"}` with `{"id", "ok": true, "result"}` or
// `{"id", "ok": false, "error"}`. It exits when that connection closes (its owner is gone), or when nobody
// connects within a minute. Not stdio: flying-squid's console takes stdin and writes prompts to stdout.
import { EventEmitter } from 'events'
import { createRequire } from 'module'
import net from 'net'
import path from 'path'
import readline from 'readline'

const config = JSON.parse(process.argv[2])
const require = createRequire(path.join(config.home, 'package.json'))
const mcServer = require('flying-squid')
const mineflayer = require('mineflayer')
const { Vec3 } = require('vec3')

const VERSION = '1.19.4' // above it flying-squid maps players to the wrong entity types
const RADIUS = 5 // blocks around a bot that observe reports
const REACH = 5 // how far a bot can dig or place
const MAX_WALK = 48 // blocks a single move_to may cover
const MAX_WAIT_S = 10
let connection = null
const say = (line) => connection?.write(JSON.stringify(line) + '\n')
console.log = console.error // a library's log line must never corrupt the protocol

const started = Date.now()
const serv = mcServer.createMCServer({
  motd: 'rollout', port: config.port, host: '127.0.0.1', 'max-players': config.names.length + 2,
  'online-mode': false, logging: false, noConsoleOutput: true, gameMode: 1, difficulty: 0, worldFolder: undefined,
  generation: { name: 'superflat', options: { worldHeight: 80 } }, kickTimeout: 60000, plugins: {}, modpe: false,
  'view-distance': 2, 'player-list-text': { header: { text: '' }, footer: { text: '' } },
  'everybody-op': false, 'max-entities': 100, version: VERSION
})
const registry = require('prismarine-registry')(VERSION)
const Item = require('prismarine-item')(registry)

serv.on('newPlayer', (player) => {
  // flying-squid sends a joining player back to its login position once the client first reports standing
  // still (a 'flying' or 'look' packet). A bot may send that only seconds later, after a task's setup has
  // teleported it, and then it snaps back to where it spawned. Let that resend happen now, during the join.
  player.waitPlayerLogin = async () => {}
  // flying-squid writes the player list to the players already there, not to the one who joins: without this
  // a bot never learns of those who joined before it, and ignores their entities.
  const toOthers = player._writeOthers.bind(player)
  player._writeOthers = (name, data) => {
    toOthers(name, data)
    if (name === 'player_info') player._client.write(name, data)
  }
  // flying-squid places a block into a cell that already holds one (two bots placing at once both "succeed",
  // the second overwriting the first): refuse that, and remember who placed what, on the server's side.
  const changeBlock = player.changeBlock
  player.changeBlock = async (position, blockType, ...rest) => {
    if (blockType === 0) placedBy.delete(key(position.x, position.y, position.z)) // dug
    return changeBlock(position, blockType, ...rest)
  }
  const setBlock = player.setBlock
  player.setBlock = async (position, stateId, ...rest) => {
    const at = key(position.x, position.y, position.z)
    const seat = config.names.indexOf(player.username)
    if (stateId === 0) {
      placedBy.delete(at)
      return setBlock(position, stateId, ...rest)
    }
    const there = await player.world.getBlock(position)
    if (there && there.name !== 'air') {
      player._client.write('block_change', { location: position, type: there.stateId }) // what is there
      placements.emit(`${seat}@${at}`, false)
      return
    }
    placedBy.set(at, seat)
    await setBlock(position, stateId, ...rest)
    placements.emit(`${seat}@${at}`, true)
  }
})

const bots = []
const chat = [] // {from, text}: every message a bot said, in order
const readUpTo = config.names.map(() => 0)
const placedBy = new Map() // "x,y,z" -> seat that placed the block there
const placements = new EventEmitter() // "seat@x,y,z" -> whether the server placed that seat's block there
const PLACE_TIMEOUT_MS = 5000
const DIG_TIMEOUT_MS = 5000
const once = (emitter, name, ms) => new Promise((resolve) => {
  const timer = setTimeout(() => { emitter.removeListener(name, done); resolve(undefined) }, ms)
  function done (value) { clearTimeout(timer); resolve(value) }
  emitter.once(name, done)
})
let groundY = null

const round = (v) => Math.round(v * 10) / 10
const cell = (p) => [Math.floor(p.x), Math.floor(p.y), Math.floor(p.z)]
const key = (x, y, z) => `${x},${y},${z}`
const FACING = ['south', 'south-west', 'west', 'north-west', 'north', 'north-east', 'east', 'south-east']

function facing (bot) {
  // mineflayer's yaw: 0 faces north (-z) and grows counter-clockwise; Minecraft's compass: 0 faces south
  const degrees = ((180 - bot.entity.yaw * 180 / Math.PI) % 360 + 360) % 360
  return FACING[Math.round(degrees / 45) % 8]
}

function target (args) {
  for (const axis of ['x', 'y', 'z']) {
    if (typeof args[axis] !== 'number' || !Number.isFinite(args[axis])) throw new Error(`give ${axis} as a number`)
  }
  return new Vec3(Math.floor(args.x), Math.floor(args.y), Math.floor(args.z))
}

function within (bot, at, reach) {
  const distance = bot.entity.position.offset(0, 1.6, 0).distanceTo(at.offset(0.5, 0.5, 0.5))
  if (distance > reach) throw new Error(`(${at.x}, ${at.y}, ${at.z}) is ${round(distance)} blocks away: move within ${reach} first`)
}

function observe (seat) {
  const bot = bots[seat]
  const here = bot.entity.position
  const [bx, by, bz] = cell(here)
  const blocks = []
  for (let y = by - 1; y <= by + RADIUS; y++) {
    for (let x = bx - RADIUS; x <= bx + RADIUS; x++) {
      for (let z = bz - RADIUS; z <= bz + RADIUS; z++) {
        const block = bot.blockAt(new Vec3(x, y, z))
        if (!block) continue
        // the flat ground is everywhere: report what stands on it, and holes dug into its top layer
        if (y > groundY && block.name !== 'air') blocks.push({ name: block.name, at: [x, y, z] })
        else if (y === groundY && block.name === 'air') blocks.push({ name: 'hole', at: [x, y, z] })
      }
    }
  }
  const others = Object.values(bot.entities)
    .filter((e) => e !== bot.entity && e.type === 'player' && e.username)
    .map((e) => ({ name: e.username, at: e.position.toArray().map(round), distance: round(e.position.distanceTo(here)) }))
    .sort((a, b) => a.distance - b.distance)
  const inventory = bot.inventory.items().map((item) => ({ name: item.name, count: item.count }))
  const heard = chat.slice(readUpTo[seat]).filter((m) => m.from !== bot.username)
  readUpTo[seat] = chat.length
  return {
    name: bot.username,
    position: here.toArray().map(round),
    facing: facing(bot),
    ground_y: groundY,
    blocks,
    players: others,
    inventory,
    chat: heard
  }
}

async function moveTo (bot, args) {
  const goal = target({ y: bot.entity.position.y, ...args })
  const centre = goal.offset(0.5, 0, 0.5)
  const horizontal = () => Math.hypot(bot.entity.position.x - centre.x, bot.entity.position.z - centre.z)
  if (horizontal() > MAX_WALK) throw new Error(`(${goal.x}, ${goal.z}) is ${round(horizontal())} blocks away: walk at most ${MAX_WALK} at a time`)
  const deadline = Date.now() + 2000 + horizontal() * 400 // walking covers ~4 blocks a second
  let best = horizontal()
  let stuckSince = Date.now()
  try {
    while (horizontal() > 0.45 && Date.now() < deadline) {
      await bot.lookAt(new Vec3(centre.x, bot.entity.position.y + 1.6, centre.z), true)
      bot.setControlState('forward', true)
      bot.setControlState('sprint', horizontal() > 3)
      await new Promise((resolve) => setTimeout(resolve, 50))
      if (horizontal() < best - 0.05) {
        best = horizontal()
        stuckSince = Date.now()
      }
      bot.setControlState('jump', Date.now() - stuckSince > 400) // a block or a bot in the way: hop over it
    }
  } finally {
    bot.clearControlStates()
  }
  await new Promise((resolve) => setTimeout(resolve, 100)) // let it come to a stop
  return { arrived: horizontal() <= 0.6, position: bot.entity.position.toArray().map(round), distance: round(horizontal()) }
}

async function dig (bot, args) {
  const at = target(args)
  within(bot, at, REACH)
  const block = bot.blockAt(at)
  if (!block || block.name === 'air') throw new Error(`there is nothing to dig at (${at.x}, ${at.y}, ${at.z})`)
  if (block.name === 'bedrock') throw new Error('bedrock cannot be dug')
  await bot.dig(block, true)
  // mineflayer counts a dig done once it has asked: wait until the server's world (what `blocks` reads) has it
  const deadline = Date.now() + DIG_TIMEOUT_MS
  while ((await serv.overworld.getBlock(at))?.name !== 'air') {
    if (Date.now() > deadline) throw new Error(`the server did not dig (${at.x}, ${at.y}, ${at.z})`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  return { dug: block.name, at: [at.x, at.y, at.z] }
}

const NEIGHBOURS = [[0, -1, 0], [0, 1, 0], [1, 0, 0], [-1, 0, 0], [0, 0, 1], [0, 0, -1]]

async function place (seat, args) {
  const bot = bots[seat]
  const at = target(args)
  within(bot, at, REACH)
  const there = bot.blockAt(at)
  if (there && there.name !== 'air') throw new Error(`(${at.x}, ${at.y}, ${at.z}) already holds ${there.name}`)
  const items = bot.inventory.items()
  const item = args.block ? items.find((i) => i.name === args.block) : items.find((i) => registry.blocksByName[i.name])
  if (!item) throw new Error(args.block ? `you have no ${args.block}` : 'you have no block to place')
  const reference = NEIGHBOURS.map(([dx, dy, dz]) => bot.blockAt(at.offset(dx, dy, dz)))
    .find((b) => b && b.boundingBox === 'block')
  if (!reference) throw new Error(`(${at.x}, ${at.y}, ${at.z}) touches no solid block to place against`)
  const feet = cell(bot.entity.position)
  if (feet[0] === at.x && feet[2] === at.z && (feet[1] === at.y || feet[1] + 1 === at.y)) {
    throw new Error('you are standing there: step aside first')
  }
  await bot.equip(item, 'hand')
  // The server's answer is the truth (see the setBlock wrapper): the bot's own wait cannot tell a block it
  // placed from one another bot placed there at the same moment.
  const k = key(at.x, at.y, at.z)
  const answered = once(placements, `${seat}@${k}`, PLACE_TIMEOUT_MS)
  bot.placeBlock(reference, at.minus(reference.position)).catch(() => {})
  const placed = await answered
  if (placed === undefined) throw new Error(`the server did not place a block at (${at.x}, ${at.y}, ${at.z})`)
  if (!placed) {
    const placer = config.names[placedBy.get(k)] ?? 'someone'
    throw new Error(`${placer} got there first: (${at.x}, ${at.y}, ${at.z}) is taken`)
  }
  if (bot.game.gameMode === 'creative') await takeOne(bot, item) // creative hands never run out: count them here
  return { placed: item.name, at: [at.x, at.y, at.z] }
}

async function takeOne (bot, item) {
  const left = item.count - 1
  await bot.creative.setInventorySlot(item.slot, left > 0 ? new Item(item.type, left) : null)
}

async function look (bot, args) {
  const at = target(args)
  await bot.lookAt(at.offset(0.5, 0.5, 0.5), true)
  const block = bot.blockAt(at)
  return { facing: facing(bot), block: block ? block.name : 'unknown', at: [at.x, at.y, at.z] }
}

// What a task sets up (never a model's tool): a block placed by the world, a bot moved to its start with items.
async function setup (seat, args) {
  const bot = bots[seat]
  for (const mark of args.blocks || []) {
    const block = registry.blocksByName[mark.name]
    if (!block) throw new Error(`unknown block ${mark.name}`)
    const at = new Vec3(...mark.at)
    if (bot.blockAt(at)?.name !== mark.name) await serv.setBlockType(serv.overworld, at, block.id)
  }
  if (args.start) {
    const player = serv.players.find((p) => p.username === bot.username)
    await player.teleport(new Vec3(args.start[0] + 0.5, args.start[1], args.start[2] + 0.5))
    await bot.waitForTicks(2)
  }
  for (const [slot, wanted] of (args.items || []).entries()) {
    const item = registry.itemsByName[wanted.name]
    if (!item) throw new Error(`unknown item ${wanted.name}`)
    await bot.creative.setInventorySlot(36 + slot, new Item(item.id, wanted.count))
  }
  return observe(seat)
}

async function blocksAt (bot, args) {
  // the server's world, not the bot's view of it (which lags what other bots just placed)
  const blocks = []
  for (const c of args.cells || []) {
    const block = await serv.overworld.getBlock(new Vec3(...c))
    blocks.push({ name: block ? block.name : 'unknown', at: c, placed_by: placedBy.get(key(...c)) ?? null })
  }
  return { blocks, position: bot.entity.position.toArray().map(round) }
}

const OPS = {
  observe: (seat) => observe(seat),
  move_to: (seat, args) => moveTo(bots[seat], args),
  look: (seat, args) => look(bots[seat], args),
  dig: (seat, args) => dig(bots[seat], args),
  place: (seat, args) => place(seat, args),
  chat: (seat, args) => {
    const text = String(args.text ?? '').trim().slice(0, 256)
    if (!text) throw new Error('say something: give text')
    if (text.startsWith('/')) throw new Error('chat is for talking: commands are not allowed')
    bots[seat].chat(text)
    chat.push({ from: bots[seat].username, text })
    return { said: text }
  },
  wait: async (seat, args) => {
    const seconds = Math.min(Math.max(Number(args.seconds) || 0, 0), MAX_WAIT_S)
    await new Promise((resolve) => setTimeout(resolve, seconds * 1000))
    return observe(seat)
  },
  setup: (seat, args) => setup(seat, args),
  blocks: (seat, args) => blocksAt(bots[seat], args),
  health: () => ({ bots: bots.length, rss_mb: Math.round(process.memoryUsage().rss / 1e6) })
}

async function answer (line) {
  let request
  try {
    request = JSON.parse(line)
  } catch {
    return say({ id: null, ok: false, error: 'not JSON' })
  }
  const op = OPS[request.op]
  if (!op) return say({ id: request.id, ok: false, error: `unknown op ${request.op}` })
  if (!bots[request.seat]) return say({ id: request.id, ok: false, error: `no bot on seat ${request.seat}` })
  try {
    say({ id: request.id, ok: true, result: await op(request.seat, request.args || {}) })
  } catch (error) {
    say({ id: request.id, ok: false, error: error.message })
  }
}

async function join (name) {
  const bot = mineflayer.createBot({ host: '127.0.0.1', port: config.port, username: name, version: VERSION, auth: 'offline' })
  await new Promise((resolve, reject) => {
    bot.once('spawn', resolve)
    bot.once('error', reject)
    bot.once('kicked', (reason) => reject(new Error(`kicked: ${reason}`)))
  })
  bot.on('error', (error) => console.error(`bot ${name}: ${error.message}`))
  bot.on('end', () => { console.error(`bot ${name} disconnected`); process.exit(3) })
  return bot
}

const owner = new Promise((resolve) => {
  const listener = net.createServer((socket) => {
    listener.close() // one owner
    connection = socket
    const lines = readline.createInterface({ input: socket })
    lines.on('line', (line) => { answer(line) })
    socket.on('close', () => process.exit(0))
    socket.on('error', () => process.exit(0))
    resolve()
  })
  listener.listen(config.socket)
})
setTimeout(() => { if (!connection) process.exit(4) }, 60000).unref()

serv.on('listening', async () => {
  const listening = Date.now() - started
  try {
    for (const name of config.names) {
      bots.push(await join(name))
      await new Promise((resolve) => setTimeout(resolve, config.stagger_ms ?? 150))
    }
    await bots[bots.length - 1].waitForTicks(10) // everyone's position has reached everyone
    groundY = Math.floor(bots[0].entity.position.y) - 1
  } catch (error) {
    console.error(`the bots could not join: ${error.message}`)
    process.exit(2)
  }
  await owner
  say({ ready: true, listening_ms: listening, ready_ms: Date.now() - started, ground_y: groundY })
})
let serverUp = false
serv.on('listening', () => { serverUp = true })
serv.on('error', (error) => {
  console.error(`server: ${error.message}`)
  if (!serverUp) process.exit(2) // it never came up (its port was taken): fail now, not after a timeout
})
